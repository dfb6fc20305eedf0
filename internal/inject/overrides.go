package inject

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The engineOverrides guard. spec.integration.engineOverrides puts env and
// arguments into the engine container of every pod the CacheBackend's
// selector matches, pods that other people in the namespace may have
// written and that run under their ServiceAccounts. The author of a
// CacheBackend must not be able to run code in them through it, nor hand
// them Secrets they did not ask for. So:
//
//   - env names that make a dynamic loader, a shell or a language runtime
//     load code (DeniedEnvNames, and any LD_* name) are rejected by the
//     validating webhook and never injected;
//   - an env value from a Secret (valueFrom.secretKeyRef) is injected only
//     into pods that opt in with AnnotationAllowSecretOverrides="true".
//
// Pods that do not opt in are admitted unwired, with the reason
// v1alpha1.SkippedOverrideNotAllowed.

// AnnotationAllowSecretOverrides opts a pod in to engineOverrides env
// values read from Secrets.
const AnnotationAllowSecretOverrides = "inferencecache.io/allow-secret-overrides"

// DeniedEnvNames are environment variables engineOverrides may never set:
// each makes a loader, shell or runtime load code or change what it loads.
var DeniedEnvNames = []string{
	"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", // and every other LD_*
	"BASH_ENV", "ENV", "PROMPT_COMMAND", "SHELLOPTS", "BASHOPTS", "PS4", "IFS", "PATH",
	"NODE_OPTIONS", "NODE_PATH",
	"PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONINSPECT", "PYTHONBREAKPOINT", "PYTHONEXECUTABLE",
	"PERL5OPT", "PERL5LIB", "PERLLIB", "RUBYOPT", "RUBYLIB",
	"JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH",
	"GLIBC_TUNABLES", "GCONV_PATH", "MALLOC_CONF", "HOSTALIASES", "RES_OPTIONS", "LOCALDOMAIN",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
	"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy",
	"VLLM_PLUGINS", "HF_ENDPOINT", "TRANSFORMERS_TRUST_REMOTE_CODE",
}

// EnvNameDenied reports why engineOverrides may not set env var name, or "".
func EnvNameDenied(name string) string {
	if strings.HasPrefix(name, "LD_") {
		return "LD_* variables change what the dynamic loader loads"
	}
	for _, d := range DeniedEnvNames {
		if name == d {
			return name + " makes a loader, shell, runtime or client load code or trust other servers"
		}
	}
	return ""
}

// ReadsSecret reports whether an override env var takes its value from a Secret.
func ReadsSecret(e corev1.EnvVar) bool {
	return e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
}
