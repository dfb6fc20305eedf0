package inject

import (
	"path"
	"slices"
	"strings"

	"github.com/inferencecache/operator/api/v1alpha1"
)

// How the engines' argument parsers read a flag, so that the webhook and
// the validating webhook recognise every spelling of a flag the injection
// sets:
//
//   - vLLM (FlexibleArgumentParser) turns underscores into dashes
//     (--kv_transfer_config), takes --flag=value and --flag value, and
//     sets one key of a JSON flag with a dotted name
//     (--kv-transfer-config.kv_role=kv_both).
//   - Both engines use Python's argparse with abbreviations allowed (vLLM's
//     FlexibleArgumentParser leaves allow_abbrev on): any prefix of a flag
//     name that no other flag shares (--hicache-rat 2, --kv-transfer-conf
//     '{...}') is that flag. The webhook does not know the engines' whole
//     flag lists, so every prefix of an injected flag counts as that flag.
//     (No vLLM flag is a prefix of --kv-transfer-config,
//     --kv-events-config or --prefix-caching-hash-algo; the conformance
//     suite runs vLLM's parser on such spellings.)
//
// Underscore spellings are recognised for both engines: treating one as the
// user's own setting only ever leaves a pod unwired, never wires it twice.

// FlagUse is one occurrence of a flag on a command line.
type FlagUse struct {
	// Value is the flag's value ("" for a boolean flag or when none follows).
	Value string
	// Partial is true for a dotted sub-key (--kv-transfer-config.kv_role=x):
	// it sets part of the flag's value.
	Partial bool
}

// FlagUses returns every occurrence of flag name on cmdline, in any
// spelling the engine accepts. abbrev recognises argparse prefix
// abbreviations (SGLang). Arguments after a bare "--" are positional.
func FlagUses(cmdline []string, name string, abbrev bool) []FlagUse {
	var uses []FlagUse
	for i := 0; i < len(cmdline); i++ {
		a := cmdline[i]
		if a == "--" {
			break
		}
		key, value, inline := strings.Cut(a, "=")
		if !SpellsFlag(key, name, abbrev) {
			continue
		}
		u := FlagUse{Value: value, Partial: strings.Contains(canonical(key), ".")}
		if !inline && i+1 < len(cmdline) && !strings.HasPrefix(cmdline[i+1], "-") {
			u.Value = cmdline[i+1]
			i++
		}
		uses = append(uses, u)
	}
	return uses
}

// SpellsFlag reports whether the command-line key (the part before any
// "=") names flag name: the same name with dashes or underscores, a dotted
// sub-key of it, or, with abbrev, a prefix of it of at least three letters
// after the dashes.
func SpellsFlag(key, name string, abbrev bool) bool {
	if !strings.HasPrefix(key, "--") || len(key) < 3 {
		return false
	}
	k := canonical(key)
	if base, _, dotted := strings.Cut(k, "."); dotted {
		k = base
	}
	if k == name {
		return true
	}
	return abbrev && len(k) >= 5 && strings.HasPrefix(name, k)
}

func canonical(key string) string {
	return "--" + strings.ReplaceAll(strings.TrimPrefix(key, "--"), "_", "-")
}

// Abbreviates reports whether the runtime's parser accepts prefix
// abbreviations of long flags: both do (vLLM 0.33 and SGLang 0.5 parse
// with argparse's allow_abbrev on).
func Abbreviates(rt v1alpha1.Runtime) bool {
	return rt == v1alpha1.RuntimeSGLang || rt == v1alpha1.RuntimeVLLM || rt == ""
}

// wrappers are init programs that run the rest of their command line:
// the shell check looks through them.
var wrappers = map[string]bool{"tini": true, "tini-static": true, "dumb-init": true, "env": true, "catatonit": true}

// shells run the command text of their -c option; su and runuser hand it
// to the user's shell.
var shells = map[string]bool{
	"sh": true, "bash": true, "dash": true, "ash": true, "zsh": true, "ksh": true, "mksh": true, "busybox": false,
	"fish": true, "csh": true, "tcsh": true, "su": true, "runuser": true,
}

// isPython reports whether prog names a Python interpreter (python,
// python3, python3.12, ...).
func isPython(prog string) bool {
	return prog == "python" || strings.HasPrefix(prog, "python2") || strings.HasPrefix(prog, "python3")
}

// pythonRunsC reports whether a Python interpreter's arguments run a
// program text (-c, alone or ending a cluster of short options) rather
// than a module (-m) or a script: flags appended after the text reach
// its sys.argv, whatever it does with them.
func pythonRunsC(args []string) bool {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case !strings.HasPrefix(a, "-") || a == "-" || a == "--":
			return false // a script, stdin, or the end of the options
		case strings.HasPrefix(a, "--"):
			continue // --version, --help-env: no program either way
		case a == "-W" || a == "-X":
			i++ // the option's argument
			continue
		}
	word:
		for _, o := range a[1:] {
			switch o {
			case 'c':
				return true
			case 'm':
				return false // -m module
			case 'W', 'X':
				break word // the rest of the word is the option's argument
			}
		}
	}
	return false
}

// shellCommand returns the shell and whether the command line runs `<shell>
// -c ...`, looking through init wrappers (tini --, dumb-init, env with
// NAME=value assignments and options, env -S "..."), and behind any other
// program: a word naming a shell followed by a -c option anywhere on the
// command line counts (nohup sh -c, setsid bash -c, timeout 1h sh -c,
// stdbuf -oL sh -c, gosu user sh -c, numactl -N0 sh -c, su-exec u fish -c,
// su user -c, ...), and so does a Python interpreter given a program
// text (python3 -c "...", not python3 -m vllm...). Flags appended after such a
// command line reach the shell's positional parameters, never the engine;
// counting one shell too many only leaves a pod unwired, with the reason.
func shellCommand(cmdline []string) (string, bool) {
	if sh, ok := wrappedShell(cmdline); ok {
		return sh, true
	}
	for i, a := range cmdline {
		if shells[path.Base(a)] && slices.ContainsFunc(cmdline[i+1:], isCOption) {
			return a, true
		}
		if isPython(path.Base(a)) && pythonRunsC(cmdline[i+1:]) {
			return a, true
		}
	}
	return "", false
}

// isCOption reports whether a shell argument is -c or a cluster of short
// options holding c (-ec, -lc).
func isCOption(a string) bool {
	return a == "-c" || (strings.HasPrefix(a, "-") && !strings.HasPrefix(a, "--") && strings.Contains(a, "c"))
}

// wrappedShell is shellCommand's walk through the init wrappers it knows.
func wrappedShell(cmdline []string) (string, bool) {
	for len(cmdline) > 0 {
		prog := path.Base(cmdline[0])
		if prog == "busybox" && len(cmdline) > 1 { // busybox sh -c ...
			cmdline = cmdline[1:]
			prog = path.Base(cmdline[0])
		}
		if shells[prog] {
			return cmdline[0], slices.ContainsFunc(cmdline[1:], isCOption)
		}
		if isPython(prog) {
			return cmdline[0], pythonRunsC(cmdline[1:])
		}
		if !wrappers[prog] {
			return "", false
		}
		rest := cmdline[1:]
		skipped := 0
		for skipped < len(rest) {
			a := rest[skipped]
			if a == "--" {
				skipped++
				break
			}
			if prog == "env" && (a == "-S" || a == "--split-string") && skipped+1 < len(rest) {
				// env -S "sh -c ..." splits its argument into words.
				return wrappedShell(append(strings.Fields(rest[skipped+1]), rest[skipped+2:]...))
			}
			if prog == "env" && (strings.HasPrefix(a, "-S") || strings.HasPrefix(a, "--split-string=")) {
				s := strings.TrimPrefix(strings.TrimPrefix(a, "--split-string="), "-S")
				return wrappedShell(append(strings.Fields(s), rest[skipped+1:]...))
			}
			if strings.HasPrefix(a, "-") || (prog == "env" && strings.Contains(a, "=")) {
				if prog == "env" && (a == "-u" || a == "--unset" || a == "-C" || a == "--chdir") {
					skipped++ // the option's argument
				}
				if (prog == "tini" || prog == "tini-static") && (a == "-p" || a == "-e") {
					skipped++
				}
				skipped++
				continue
			}
			break
		}
		cmdline = rest[skipped:]
	}
	return "", false
}
