package validation

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/engineversion"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/internal/topology"
)

// ExtraArgsRefused is why spec.remoteStorage.lmCacheServer.extraArgs is
// refused: LMCache's lmcache_server takes no argument beyond the three the
// operator renders.
const ExtraArgsRefused = "lmcache_server (LMCache 0.5) takes exactly <host> <port> [device] and exits with a usage error on any other argument; " +
	"the operator renders all three (" + render.ServerCommand + " 0.0.0.0 <port> " + render.ServerDevice + "), so extraArgs must be empty"

// StorageInMemoryOnly is the admission warning on spec.storage.pvc.
const StorageInMemoryOnly = "spec.storage.pvc: lmcache_server (LMCache 0.5) keeps KV in memory only: the claim is mounted at /data but the server does not write it, " +
	"and a restarted server starts empty; for KV that survives an engine restart use spec.lmCache.localDisk (LMCache's local disk tier in the engines)"

// ReplicasPartition is the admission warning on more than one server
// replica (spec replicas above 1, or an HPA): each lmcache_server keeps its
// own memory, and an engine's LMCache connector holds one connection,
// which the Service gives to one replica.
const ReplicasPartition = "more than one lmcache_server replica: each replica keeps its own KV in memory and shares nothing with the others, " +
	"and each engine's LMCache connection reaches one replica through the Service, so engines share KV only with the engines that reached the same replica"

// ExtraArgsIgnored is the admission warning on an update that keeps the
// extraArgs an object was stored with before they were refused.
const ExtraArgsIgnored = "spec.remoteStorage.lmCacheServer.extraArgs: ignored (the server is run without them); remove them: any change to them is refused"

var extraArgsPath = field.NewPath("spec", "remoteStorage", "lmCacheServer", "extraArgs")

func extraArgs(cb *v1alpha1.CacheBackend) []string {
	if cb == nil || cb.Spec.RemoteStorage == nil || cb.Spec.RemoteStorage.LMCacheServer == nil {
		return nil
	}
	return cb.Spec.RemoteStorage.LMCacheServer.ExtraArgs
}

// serverErrors are the rules of the managed server: extraArgs must be
// empty, and an in-process server needs an LMCache that still ships
// lmcache_server. On an update (old set) extraArgs kept exactly as stored
// are let through, so that an object created before the rule can still be
// edited (and deleted through finalizer updates); render never passes
// them. The same holds for a server release stored before its rule.
func serverErrors(old, cb *v1alpha1.CacheBackend) field.ErrorList {
	var errs field.ErrorList
	if args := extraArgs(cb); len(args) > 0 && (old == nil || !slices.Equal(args, extraArgs(old))) {
		errs = append(errs, field.Forbidden(extraArgsPath, ExtraArgsRefused))
	}
	if msg := inProcessServerRemoved(cb); msg != "" && (old == nil || inProcessServerRemoved(old) != msg) {
		errs = append(errs, field.Invalid(imagePath, render.ServerImage(cb), msg))
	}
	return errs
}

var imagePath = field.NewPath("spec", "remoteStorage", "lmCacheServer", "image")

// InProcessServerSince is the first LMCache release without the in-process
// server (lmcache_server, lmcache.v1.server) and the lm:// connector the
// engines reach it with.
var InProcessServerSince = engineversion.MustParse("0.5.7")

// ServerLMCache is the LMCache release of cb's server: the image tag (an
// lmcache/* image of Docker Hub), else spec.integration.versions.lmcache.
func ServerLMCache(cb *v1alpha1.CacheBackend) engineversion.Detected {
	declared := ""
	if v := cb.Spec.Integration.Versions; v != nil {
		declared = v.LMCache
	}
	d, err := engineversion.Detect(engineversion.LMCache, "", render.ServerImage(cb), declared)
	if err != nil {
		return engineversion.Detected{Source: engineversion.Unknown}
	}
	return d
}

// inProcessServerRemoved returns why cb's in-process server cannot run, or
// "": its LMCache release has no lmcache_server.
func inProcessServerRemoved(cb *v1alpha1.CacheBackend) string {
	if cb.Spec.Type != v1alpha1.BackendTypeLMCache || topology.Of(cb) == topology.Multiprocess {
		return ""
	}
	d := ServerLMCache(cb)
	if !d.Known || !d.Version.AtLeast(InProcessServerSince) {
		return ""
	}
	return fmt.Sprintf("the server image runs LMCache %s (read from the %s), which has no lmcache_server: LMCache 0.5.7 removed the in-process server "+
		"(lmcache.v1.server) and the lm:// connector the engines reach it with. The in-process shape (a Deployment or StatefulSet of lmcache_server) "+
		"needs an LMCache 0.5.6 image (the default, %s); for LMCache 0.5.7 and later set spec.multiprocess "+
		"(docs/guides/migrate-to-multiprocess.md)", d.Version, sourceNoun(d.Source), render.DefaultImage)
}

func sourceNoun(s engineversion.Source) string {
	if s == engineversion.FromBackend {
		return "spec.integration.versions.lmcache"
	}
	return "image tag"
}

// Warnings are the admission warnings for cb (old is the stored object on
// an update, nil on a create): storage that does not persist, replicas
// that partition the cache, and extraArgs kept from before they were
// refused.
func Warnings(old, cb *v1alpha1.CacheBackend) []string {
	var w []string
	if cb.Spec.Type == v1alpha1.BackendTypeLMCache && cb.Spec.Storage != nil && cb.Spec.Storage.PVC != nil {
		w = append(w, StorageInMemoryOnly)
	}
	if cb.Spec.Type == v1alpha1.BackendTypeLMCache && (render.Replicas(cb) > 1 || (cb.Spec.Autoscaling != nil && cb.Spec.Autoscaling.MaxReplicas > 1)) {
		w = append(w, ReplicasPartition)
	}
	if old != nil && len(extraArgs(cb)) > 0 && serverErrors(old, cb) == nil {
		w = append(w, ExtraArgsIgnored)
	}
	return w
}
