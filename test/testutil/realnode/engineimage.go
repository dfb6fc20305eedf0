package realnode

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/klauspost/compress/gzip"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/inferencecache/operator/api/v1alpha1"
	"github.com/inferencecache/operator/internal/inject"
	"github.com/inferencecache/operator/internal/lmcacheproto"
	"github.com/inferencecache/operator/internal/render"
	"github.com/inferencecache/operator/test/testutil/freeport"
)

// EngineProgram is where the stand-in engine (py/engine.py) is in the
// image EngineImageArchive builds: engine pods run `python3 EngineProgram`
// with the engine's arguments.
const EngineProgram = "/usr/local/lib/inferencecache-test/engine.py"

// EngineImageArchive returns a docker archive, tagged ref, of an image of
// the Python environment pyEnv (a cell of test/tools/python, as `make
// pyenv` built it: vLLM and LMCache, the content of LMCache's
// lmcache/vllm-openai images) holding the files that three programs use,
// found by running them (py/trace.py):
//
//   - LMCache's in-process server (`lmcache_server`) with the rendered
//     probe against it;
//   - LMCache's multiprocess server (`lmcache server`, the rendered
//     command line) with its rendered exec probe and metrics gate;
//   - the stand-in engine EngineProgram (py/engine.py: vLLM's own parser
//     and KV-event publisher, LMCache's own clients).
//
// The files are at the same paths as on this machine, with the
// interpreter's standard library, and the environment's bin first on PATH
// (lmcache_server, lmcache and python3, as the rendered containers call
// them). Nothing is downloaded again. The one layer is gzip-compressed
// (containerd keeps the archive's blob beside the unpacked files). The
// archive is built once per environment into cacheDir, under a lock; an
// older one is removed.
func EngineImageArchive(ctx context.Context, pyEnv, cacheDir, ref string) (string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	_, self, _, _ := runtime.Caller(0)
	pyDir := filepath.Join(filepath.Dir(self), "py")
	tracer, program := filepath.Join(pyDir, "trace.py"), filepath.Join(pyDir, "engine.py")
	script, err := os.ReadFile(tracer)
	if err != nil {
		return "", err
	}
	engine, err := os.ReadFile(program)
	if err != nil {
		return "", err
	}
	// A sample multiprocess server, as rendered (its ports are chosen
	// free at each trace; the cache key does not depend on them).
	mp := func(port, httpPort int32) (argv, gate, probe []string) {
		s := render.MPServerFor(&v1alpha1.CacheBackend{Spec: v1alpha1.CacheBackendSpec{
			Type: v1alpha1.BackendTypeLMCache,
			Multiprocess: &v1alpha1.Multiprocess{Port: port, HTTPPort: httpPort,
				L1: v1alpha1.MultiprocessL1{Size: resource.MustParse("1Gi")}},
		}})
		g := render.MPMetricsGate(ref, s)
		return append(slices.Clone(render.MPServerCommand[1:]), render.MPServerArgs(s)...), append(slices.Clone(g.Command), g.Args...), render.MPProbeCommand(s)
	}
	sampleArgv, sampleGate, sampleProbe := mp(1, 2)
	// archiveLayout names how this function lays the image out: change it
	// with the code, so a cached archive of an older layout is not reused.
	const archiveLayout = "8"
	h0 := sha256.New()
	for _, part := range []string{archiveLayout, pyEnv, ref, string(script), string(engine), lmcacheproto.ProbeScript(),
		strings.Join(sampleArgv, " "), strings.Join(sampleGate, " "), strings.Join(sampleProbe, " ")} {
		fmt.Fprintf(h0, "%s\x00", part)
	}
	sum := h0.Sum(nil)
	out := filepath.Join(cacheDir, fmt.Sprintf("engine-%s.tar", hex.EncodeToString(sum[:8])))
	lock, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", err
	}
	defer func() { _ = lock.Close() }()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}

	// One archive per cache: an older layout's or environment's goes
	// first (they are gigabytes, and the disk is shared).
	for _, glob := range []string{"lmcache-server-*.tar", "engine-*.tar"} {
		old, _ := filepath.Glob(filepath.Join(cacheDir, glob))
		for _, o := range old {
			_ = os.Remove(o)
		}
	}

	type traced struct {
		Files  []string `json:"files"`
		Prefix string   `json:"prefix"`
		Stdlib string   `json:"stdlib"`
	}
	run := func(args ...string) (traced, error) {
		var t traced
		f, err := os.CreateTemp(cacheDir, ".trace-*.json")
		if err != nil {
			return t, err
		}
		_ = f.Close()
		defer func() { _ = os.Remove(f.Name()) }()
		cmd := exec.CommandContext(ctx, filepath.Join(pyEnv, "bin", "python"), append([]string{tracer}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1", "CUDA_VISIBLE_DEVICES=", "LMCACHE_TRACK_USAGE=false", "HF_HUB_OFFLINE=1", "TRACE_OUT="+f.Name())
		cmd.Dir = cacheDir
		var output bytes.Buffer
		cmd.Stdout, cmd.Stderr = &output, &output
		if err := cmd.Run(); err != nil {
			return t, fmt.Errorf("tracing %s in %s: %w\n%s", args[0], pyEnv, err, tail(output.String(), 4000))
		}
		b, err := os.ReadFile(f.Name())
		if err != nil {
			return t, err
		}
		if err := json.Unmarshal(b, &t); err != nil {
			return t, fmt.Errorf("tracing %s: the tracer wrote no JSON: %w", args[0], err)
		}
		return t, nil
	}
	ports, err := freeport.TakeN(3)
	if err != nil {
		return "", err
	}
	mpArgv, mpGate, mpProbe := mp(int32(ports[1]), int32(ports[2]))
	js := func(v []string) string { b, _ := json.Marshal(v); return string(b) }
	var trace traced
	var traceFiles []string
	for _, args := range [][]string{
		{"server", fmt.Sprint(ports[0]), lmcacheproto.ProbeScript()},
		{"mp", js(mpArgv), js(mpGate), js(mpProbe)},
		{"engine", program, "--model", "Qwen/Qwen2.5-0.5B-Instruct", "--kv-transfer-config",
			inject.MPKVTransferConfig("localhost", 5555, v1alpha1.RoleReadWrite)},
	} {
		if trace, err = run(args...); err != nil {
			return "", err
		}
		traceFiles = append(traceFiles, trace.Files...)
	}
	slices.Sort(traceFiles)
	traceFiles = slices.Compact(traceFiles)

	files := slices.Clone(traceFiles)
	// The interpreter's whole standard library (the probe's python3 -c
	// and whatever the server imports lazily), the environment's own
	// files (pyvenv.cfg, bin).
	for _, dir := range []string{trace.Stdlib, filepath.Join(trace.Prefix, "bin")} {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && (d.Name() == "site-packages" || d.Name() == "test" || d.Name() == "__pycache__" || d.Name() == "idlelib" || d.Name() == "tkinter") {
				return filepath.SkipDir
			}
			if !d.IsDir() {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	files = append(files, filepath.Join(trace.Prefix, "pyvenv.cfg"))
	// Every package the server imported, whole: a package reads files
	// beside its modules (torch's torch_shm_manager) and modules replace
	// themselves in sys.modules (torch._VF), so the trace alone misses
	// some. nvidia's CUDA libraries (3.5 GB) are the exception: those the
	// process mapped are enough.
	pkgs := map[string]bool{}
	for _, f := range traceFiles {
		if i := strings.Index(f, "/site-packages/"); i >= 0 {
			if pkg, _, ok := strings.Cut(f[i+len("/site-packages/"):], "/"); ok && pkg != "nvidia" {
				pkgs[f[:i+len("/site-packages/")]+pkg] = true
			}
		}
	}
	for dir := range pkgs {
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() && d.Name() == "__pycache__" {
				return filepath.SkipDir
			}
			if !d.IsDir() {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	// The packages' metadata (importlib.metadata reads it: versions,
	// entry points) and the site directory's own files (.pth).
	for _, f := range traceFiles {
		if i := strings.Index(f, "/site-packages/"); i >= 0 {
			site := f[:i+len("/site-packages")]
			entries, err := os.ReadDir(site)
			if err != nil {
				return "", err
			}
			for _, e := range entries {
				p := filepath.Join(site, e.Name())
				switch {
				case strings.HasSuffix(e.Name(), ".pth") && !pthImports(p, pkgs):
					// A .pth that imports a package the image leaves out
					// (nvidia_cutlass_dsl's) would print a traceback at
					// every interpreter start, probes included.
				case !e.IsDir():
					files = append(files, p)
				case strings.HasSuffix(e.Name(), ".dist-info"):
					sub, err := os.ReadDir(p)
					if err != nil {
						return "", err
					}
					for _, m := range sub {
						if !m.IsDir() {
							files = append(files, filepath.Join(p, m.Name()))
						}
					}
				}
			}
			break
		}
	}
	// The ELF interpreter the executables name (a path through links on
	// Debian: /lib64 -> usr/lib64 -> ...), and the loader's cache.
	interp, err := elfInterpreter(filepath.Join(trace.Prefix, "bin", "python"))
	if err != nil {
		return "", err
	}
	files = append(files, interp)
	if _, err := os.Stat("/etc/ld.so.cache"); err == nil {
		files = append(files, "/etc/ld.so.cache")
	}
	// A mapped library is listed by its real name (libz.so.1.2.13); the
	// loader looks for the name it was linked with (libz.so.1): the links
	// beside it that lead to it.
	files = append(files, sonameLinks(files)...)

	layer, err := os.CreateTemp(cacheDir, ".layer-*.tar.gz")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.Remove(layer.Name()) }()
	// The diff ID is the digest of the uncompressed layer.
	h := sha256.New()
	zw, err := gzip.NewWriterLevel(layer, gzip.BestSpeed)
	if err != nil {
		return "", err
	}
	if err := writeTree(io.MultiWriter(zw, h), files, map[string]string{EngineProgram: string(engine)}); err != nil {
		_ = layer.Close()
		return "", err
	}
	if err := errors.Join(zw.Close(), layer.Close()); err != nil {
		return "", err
	}
	diffID := "sha256:" + hex.EncodeToString(h.Sum(nil))

	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH, "os": "linux", "created": time.Unix(0, 0).UTC(),
		"config": map[string]any{
			"Env":        []string{"PATH=" + filepath.Join(trace.Prefix, "bin") + ":/usr/local/bin:/usr/bin:/bin"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{diffID}},
	})
	if err != nil {
		return "", err
	}
	cs := sha256.Sum256(config)
	configName := hex.EncodeToString(cs[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{"Config": configName, "RepoTags": []string{ref}, "Layers": []string{"layer.tar.gz"}}})
	if err != nil {
		return "", err
	}
	tmp := out + ".tmp"
	if err := writeArchive(tmp, layer.Name(), configName, config, manifest); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", err
	}
	return out, nil
}

// writeArchive writes a docker archive (docker save's layout): the layer,
// its config and manifest.json.
func writeArchive(path, layer, configName string, config, manifest []byte) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	add := func(name string, body []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	l, err := os.Open(layer)
	if err != nil {
		return errors.Join(err, f.Close())
	}
	defer func() { _ = l.Close() }()
	st, err := l.Stat()
	if err != nil {
		return errors.Join(err, f.Close())
	}
	err = tw.WriteHeader(&tar.Header{Name: "layer.tar.gz", Mode: 0o644, Size: st.Size(), ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg})
	if err == nil {
		_, err = io.Copy(tw, l)
	}
	if err == nil {
		err = add(configName, config)
	}
	if err == nil {
		err = add("manifest.json", manifest)
	}
	return errors.Join(err, tw.Close(), f.Close())
}

// writeTree writes files as a layer at their absolute paths: each with its
// parent directories, and every symbolic link on the way (a file reached
// through one is written at its real path, the link as a link), so the
// layout of this machine is kept for the files listed and nothing else.
func writeTree(w io.Writer, files []string, extra map[string]string) error {
	tw := tar.NewWriter(w)
	done := map[string]bool{"/": true}
	var add func(p string) error
	add = func(p string) error {
		p = filepath.Clean(p)
		if done[p] {
			return nil
		}
		parent := filepath.Dir(p)
		if err := add(parent); err != nil {
			return err
		}
		done[p] = true
		// Under a link (written above as a link): p is written where it
		// really is, never through the link.
		if real, err := filepath.EvalSymlinks(parent); err != nil {
			return err
		} else if real != parent {
			return add(filepath.Join(real, filepath.Base(p)))
		}
		st, err := os.Lstat(p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: time.Unix(0, 0), Mode: int64(st.Mode().Perm())}
		switch {
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			abs := target
			if !filepath.IsAbs(abs) {
				abs = filepath.Join(filepath.Dir(p), target)
			}
			return add(abs)
		case st.IsDir():
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			return tw.WriteHeader(hdr)
		case st.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, st.Size()
			// Readable by the pod's non-root user.
			hdr.Mode |= 0o444
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer func() { _ = f.Close() }()
			_, err = io.Copy(tw, f)
			return err
		default:
			return nil // devices, sockets: not part of an image
		}
	}
	for _, f := range files {
		if err := add(f); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	for _, p := range slices.Sorted(maps.Keys(extra)) {
		for _, dir := range parents(p) {
			if !done[dir] {
				done[dir] = true
				if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(dir, "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
					return err
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: strings.TrimPrefix(p, "/"), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(extra[p])), ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		if _, err := io.WriteString(tw, extra[p]); err != nil {
			return err
		}
	}
	// /tmp for a process that needs one (the rendered pod mounts its
	// scratch volume over it).
	if err := tw.WriteHeader(&tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	return tw.Close()
}

// pthImports reports whether every module the .pth file p imports (its
// "import a, b" lines) is a package in pkgs (site-packages paths) or not
// in site-packages at all (the standard library's).
func pthImports(p string, pkgs map[string]bool) bool {
	b, err := os.ReadFile(p)
	if err != nil {
		return false
	}
	site := filepath.Dir(p)
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "import ")
		if !ok {
			continue
		}
		names, _, _ := strings.Cut(rest, ";")
		for _, name := range strings.Split(names, ",") {
			name = strings.TrimSpace(name)
			dir := filepath.Join(site, name)
			if _, err := os.Stat(dir); err == nil && !pkgs[dir] {
				return false
			}
		}
	}
	return true
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// elfInterpreter is the program interpreter (PT_INTERP) of the executable
// at path.
func elfInterpreter(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return "", err
			}
			return strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return "", fmt.Errorf("%s names no ELF interpreter", path)
}

// sonameLinks are the symbolic links, in the directories of the shared
// objects among files, that resolve to one of them.
func sonameLinks(files []string) []string {
	real := map[string]bool{}
	dirs := map[string]bool{}
	for _, f := range files {
		if !strings.Contains(filepath.Base(f), ".so") {
			continue
		}
		if r, err := filepath.EvalSymlinks(f); err == nil {
			real[r] = true
			dirs[filepath.Dir(f)] = true
			dirs[filepath.Dir(r)] = true
		}
	}
	var links []string
	for d := range dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.Type()&os.ModeSymlink == 0 {
				continue
			}
			p := filepath.Join(d, e.Name())
			if r, err := filepath.EvalSymlinks(p); err == nil && real[r] {
				links = append(links, p)
			}
		}
	}
	slices.Sort(links)
	return links
}

// parents are the directories above the absolute path p, outermost first,
// "/" left out.
func parents(p string) []string {
	var out []string
	for d := filepath.Dir(p); d != "/" && d != "."; d = filepath.Dir(d) {
		out = append([]string{d}, out...)
	}
	return out
}
