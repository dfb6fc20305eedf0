"""Writes a tiny Llama model into the folder argv[1], made here and nowhere
else: random weights (seeded) saved with transformers, and a word-level
tokenizer built with tokenizers whose words w0..w996 are token IDs 3..999.
CPU attention in vLLM needs a head size it has kernels for (64 here).
Prints the folder's files as JSON."""
import json
import os
import sys

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for i in range(997):
    vocab[f"w{i}"] = len(vocab)
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.save(os.path.join(out, "tokenizer.json"))
with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
               "eos_token": "</s>", "model_max_length": 256, "clean_up_tokenization_spaces": False}, f)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, torch_dtype="float32")
LlamaForCausalLM(cfg).save_pretrained(out)
print(json.dumps(sorted(os.listdir(out))))
