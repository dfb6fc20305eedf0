package validation

import (
	"fmt"
	"net"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
)

// Why the in-process server's fields are refused next to
// spec.multiprocess: they configure a server that multiprocess mode does
// not run.
const (
	mpInProcess = "belongs to the in-process lmcache_server, which multiprocess mode does not run"
	// MPTLSRefused is why spec.multiprocess.l2.resp.tls is refused.
	MPTLSRefused = "LMCache 0.5.6's resp adapter has no TLS (its valkey adapter has, but needs valkey-glide, which LMCache does not install): " +
		"the server would talk to Redis in clear text; use a Redis reachable inside the cluster network, or leave tls unset"
)

var mpPath = field.NewPath("spec", "multiprocess")

// mpMemoryHeadroom is the least memory limit of the MP server above its
// L1: the real server with a 1 GiB L1 holds 1.83 GB resident when idle
// (process_resident_memory_bytes of LMCache 0.5.6's /metrics).
var mpMemoryHeadroom = resource.MustParse("1Gi")

// multiprocessErrors are the rules of multiprocess mode (absent: none):
// what LMCache's own `lmcache server` refuses or silently accepts wrong
// (research §1d: watermark 1.5, ratio -1 and an L1 of 0 start a server
// that cannot work), and the in-process server's fields, which the mode
// does not use.
func multiprocessErrors(cb *v1alpha1.CacheBackend) field.ErrorList {
	mp := cb.Spec.Multiprocess
	if mp == nil {
		return nil
	}
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if cb.Spec.DeploymentKind == v1alpha1.DeploymentKindStatefulSet {
		errs = append(errs, field.Forbidden(spec.Child("deploymentKind"), "StatefulSet "+mpInProcess+": multiprocess mode runs one server per node as a DaemonSet"))
	}
	if cb.Spec.Storage != nil {
		errs = append(errs, field.Forbidden(spec.Child("storage"), mpInProcess+": use spec.multiprocess.l2.disk for KV on disk"))
	}
	if cb.Spec.Autoscaling != nil {
		errs = append(errs, field.Forbidden(spec.Child("autoscaling"), mpInProcess+": multiprocess mode runs one server per selected node"))
	}
	if cb.Spec.LMCache != nil {
		errs = append(errs, field.Forbidden(spec.Child("lmCache"), "configures the engines' in-process LMCache, which LMCacheMPConnector does not use: the node's server holds the tiers (spec.multiprocess.l1, .l2)"))
	}
	if s := server(cb); s != nil {
		srv := spec.Child("remoteStorage", "lmCacheServer")
		if s.Replicas != nil {
			errs = append(errs, field.Forbidden(srv.Child("replicas"), mpInProcess+": multiprocess mode runs one server per selected node"))
		}
		if s.Port != 0 && s.Port != topology.DefaultPort {
			errs = append(errs, field.Forbidden(srv.Child("port"), mpInProcess+": set spec.multiprocess.port"))
		}
		if r := s.Resources; r != nil {
			if limit, ok := r.Limits[corev1.ResourceMemory]; ok {
				least := mp.L1.Size.DeepCopy()
				least.Add(mpMemoryHeadroom)
				if limit.Cmp(least) < 0 {
					errs = append(errs, field.Invalid(srv.Child("resources", "limits", "memory"), limit.String(), fmt.Sprintf(
						"must be at least %s in multiprocess mode (spec.multiprocess.l1.size + %s): the server holds its L1 in host memory from the start "+
							"and about 0.8 GiB besides when idle (LMCache 0.5.6, measured), so a lower limit OOM-kills it, and each restart evicts its node's engines; "+
							"unset, the limit is derived from L1", least.String(), mpMemoryHeadroom.String())))
				}
			}
		}
	}
	if mp.Port != 0 && mp.Port == mp.HTTPPort {
		errs = append(errs, field.Duplicate(mpPath.Child("httpPort"), mp.HTTPPort))
	}
	errs = append(errs, mpSize(mpPath.Child("l1", "size"), mp.L1.Size)...)
	if q := mp.EngineSharedMemory; q != nil && q.Cmp(MaxMPSize) > 0 {
		errs = append(errs, field.Invalid(mpPath.Child("engineSharedMemory"), q.String(), "must be at most "+MaxMPSize.String()))
	}
	if mp.L2 == nil {
		return errs
	}
	if r := mp.L2.RESP; r != nil {
		resp := mpPath.Child("l2", "resp")
		if r.TLS {
			errs = append(errs, field.Forbidden(resp.Child("tls"), MPTLSRefused))
		}
		if net.ParseIP(r.Host) == nil {
			for _, msg := range validation.IsDNS1123Subdomain(r.Host) {
				errs = append(errs, field.Invalid(resp.Child("host"), r.Host, "a DNS name or IP address: "+msg))
			}
		}
		if c := r.CredentialsSecretRef; c != nil {
			for _, msg := range validation.IsDNS1123Subdomain(c.Name) {
				errs = append(errs, field.Invalid(resp.Child("credentialsSecretRef", "name"), c.Name, msg))
			}
			for k, v := range map[string]string{"usernameKey": c.UsernameKey, "passwordKey": c.PasswordKey} {
				if v == "" {
					continue
				}
				for _, msg := range validation.IsConfigMapKey(v) {
					errs = append(errs, field.Invalid(resp.Child("credentialsSecretRef", k), v, msg))
				}
			}
		}
		errs = append(errs, mpSize(resp.Child("capacity"), r.Capacity)...)
	}
	if d := mp.L2.Disk; d != nil {
		disk := mpPath.Child("l2", "disk")
		p := d.Path
		switch {
		case p == "":
			// defaulted by the schema; an object decoded without defaults
			// renders render.DefaultMPDiskPath
		case !path.IsAbs(p) || path.Clean(p) != p:
			errs = append(errs, field.Invalid(disk.Child("path"), p, "must be an absolute, clean path (no trailing '/', '.' or '..')"))
		case p == "/":
			errs = append(errs, field.Invalid(disk.Child("path"), p, "must not be the root folder: the tier's volume is mounted there"))
		case p == render.ScratchPath || strings.HasPrefix(p, render.ScratchPath+"/"):
			errs = append(errs, field.Invalid(disk.Child("path"), p, fmt.Sprintf("must not be in %s, the server's scratch space", render.ScratchPath)))
		}
		errs = append(errs, mpSize(disk.Child("capacity"), d.Capacity)...)
	}
	return errs
}

// MaxMPSize bounds every size of spec.multiprocess: 1 PiB, above any
// node's memory or disk, and far below what overflows the rendering (the
// server's GiB counts are int32, --l1-size-gb and max_capacity_gb; its
// memory limit, 1.5 × (L1 + 5 GiB), is int64 bytes). LMCache reads the
// sizes as floats and multiplies them back into bytes, exactly up to
// 2^53. A larger size, 4Ei, was rendered --l1-size-gb 0.
var MaxMPSize = resource.MustParse("1Pi")

// mpSize refuses a size of spec.multiprocess above MaxMPSize, or not a
// whole number of GiB of at least one.
func mpSize(p *field.Path, q resource.Quantity) field.ErrorList {
	if q.Cmp(MaxMPSize) > 0 {
		return field.ErrorList{field.Invalid(p, q.String(), fmt.Sprintf("must be at most %s (%d GiB)", MaxMPSize.String(), MaxMPSize.Value()>>30))}
	}
	return wholeGiB(p, q)
}

// wholeGiB refuses a size that is not a whole number of GiB of at least
// one: LMCache's --l1-size-gb and max_capacity_gb are GiB, and the
// operator derives the container's memory and the volume from them.
func wholeGiB(p *field.Path, q resource.Quantity) field.ErrorList {
	if q.Cmp(resource.MustParse("1Gi")) < 0 || q.Value()%(1<<30) != 0 {
		return field.ErrorList{field.Invalid(p, q.String(), "must be a whole number of GiB of at least 1Gi (LMCache takes the size in GiB)")}
	}
	return nil
}

func server(cb *v1alpha1.CacheBackend) *v1alpha1.LMCacheServer {
	if cb.Spec.RemoteStorage == nil {
		return nil
	}
	return cb.Spec.RemoteStorage.LMCacheServer
}
