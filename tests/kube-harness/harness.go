package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// harness owns the embedded etcd and the API servers, and serves the
// control endpoint.
type harness struct {
	ctx      context.Context // cancelled on process shutdown
	shutdown func()          // asks main to shut the process down
	dir      string
	etcd     *embeddedEtcd

	mu sync.Mutex
	// servers holds running API servers; a name maps to nil while its API
	// server is starting or stopping (so the name cannot be taken twice).
	servers map[string]*apiServer
}

func newHarness(ctx context.Context, dir string, etcd *embeddedEtcd, shutdown func()) *harness {
	return &harness{ctx: ctx, shutdown: shutdown, dir: dir, etcd: etcd, servers: map[string]*apiServer{}}
}

// API server names become etcd prefixes, directory and kubeconfig names.
var validName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

func (h *harness) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /stats", h.stats)
	mux.HandleFunc("GET /apiservers", h.list)
	mux.HandleFunc("POST /apiservers", h.create)
	mux.HandleFunc("GET /apiservers/{name}", h.get)
	mux.HandleFunc("DELETE /apiservers/{name}", h.delete)
	mux.HandleFunc("POST /apiservers/{name}/crds", h.addCRDs)
	mux.HandleFunc("POST /shutdown", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusAccepted, map[string]string{"status": "shutting down"})
		go h.shutdown()
	})
	return mux
}

// POST /apiservers {"name": "...", "crds": [...], "controllers": [...], "args": [...], "node_url": "..."}
// answers once the API server is ready.
func (h *harness) create(w http.ResponseWriter, r *http.Request) {
	var req startRequest
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err))
		return
	}
	if !validName.MatchString(req.Name) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("name %q must be a DNS label ([a-z0-9-], at most 63 characters)", req.Name))
		return
	}
	if req.Controllers != nil {
		if _, err := expandControllers(req.Controllers); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
	}
	if _, err := nodeURLHost(req.NodeURL); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	for _, path := range req.CRDs {
		if _, err := os.Stat(path); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
	}

	h.mu.Lock()
	if _, taken := h.servers[req.Name]; taken {
		h.mu.Unlock()
		writeError(w, http.StatusConflict, fmt.Errorf("API server %q already exists", req.Name))
		return
	}
	h.servers[req.Name] = nil // reserved while starting
	h.mu.Unlock()

	// Leftovers of an earlier API server of the same name would be served
	// again: start from an empty prefix.
	if _, err := h.etcd.deletePrefix(h.ctx, etcdPrefix(req.Name)); err != nil {
		h.release(req.Name)
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	// Started under the process context, not the request's: the API server
	// outlives this request.
	srv, err := startAPIServer(h.ctx, h.dir, h.etcd.clientURL, req)
	if err != nil {
		h.release(req.Name)
		klog.ErrorS(err, "Starting API server failed", "name", req.Name)
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	h.mu.Lock()
	h.servers[req.Name] = srv
	h.mu.Unlock()
	writeJSON(w, http.StatusCreated, srv.info)
}

func (h *harness) release(name string) {
	h.mu.Lock()
	delete(h.servers, name)
	h.mu.Unlock()
}

// GET /apiservers lists the ready API servers, sorted by name.
func (h *harness) list(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	infos := []apiServerInfo{}
	for _, srv := range h.servers {
		if srv != nil {
			infos = append(infos, srv.info)
		}
	}
	h.mu.Unlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].Name < infos[j].Name })
	writeJSON(w, http.StatusOK, map[string]any{"apiservers": infos})
}

func (h *harness) lookup(w http.ResponseWriter, name string) *apiServer {
	h.mu.Lock()
	srv, ok := h.servers[name]
	h.mu.Unlock()
	switch {
	case !ok:
		writeError(w, http.StatusNotFound, fmt.Errorf("no API server %q", name))
	case srv == nil:
		writeError(w, http.StatusConflict, fmt.Errorf("API server %q is starting or stopping", name))
	}
	return srv
}

func (h *harness) get(w http.ResponseWriter, r *http.Request) {
	if srv := h.lookup(w, r.PathValue("name")); srv != nil {
		writeJSON(w, http.StatusOK, srv.info)
	}
}

// DELETE /apiservers/{name} stops the API server and its controllers,
// deletes its etcd prefix and its directory.
func (h *harness) delete(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	h.mu.Lock()
	srv, ok := h.servers[name]
	if ok && srv != nil {
		h.servers[name] = nil // stopping
	}
	h.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Errorf("no API server %q", name))
		return
	}
	if srv == nil {
		writeError(w, http.StatusConflict, fmt.Errorf("API server %q is starting or stopping", name))
		return
	}
	begin := time.Now()
	stopErr := srv.shutdown(60 * time.Second)
	deleted, err := h.etcd.deletePrefix(h.ctx, srv.info.EtcdPrefix)
	if err == nil {
		err = os.RemoveAll(srv.info.Dir)
	}
	h.release(name)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	resp := map[string]any{"name": name, "deleted_etcd_keys": deleted, "stop_seconds": time.Since(begin).Seconds()}
	if stopErr != nil {
		// Still removed; report what went wrong while stopping.
		resp["stop_error"] = stopErr.Error()
	}
	klog.InfoS("API server deleted", "name", name, "etcdKeys", deleted, "stopErr", stopErr)
	writeJSON(w, http.StatusOK, resp)
}

// POST /apiservers/{name}/crds {"crds": [...]} installs CRDs into a running
// API server and answers once they are Established.
func (h *harness) addCRDs(w http.ResponseWriter, r *http.Request) {
	srv := h.lookup(w, r.PathValue("name"))
	if srv == nil {
		return
	}
	var req struct {
		CRDs []string `json:"crds"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("invalid JSON body: %w", err))
		return
	}
	names, err := installCRDs(r.Context(), srv.loopback, req.CRDs)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"crds": names})
}

// stopAll stops every API server (in parallel) at process shutdown.
func (h *harness) stopAll() {
	h.mu.Lock()
	servers := h.servers
	h.servers = map[string]*apiServer{}
	h.mu.Unlock()
	var wg sync.WaitGroup
	for name, srv := range servers {
		if srv == nil {
			continue // a start in flight is cancelled through h.ctx
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.shutdown(30 * time.Second); err != nil {
				klog.ErrorS(err, "Stopping API server", "name", name)
			}
		}()
	}
	wg.Wait()
}

// GET /stats reports the process's memory use and goroutines (for
// measurements and leak hunting).
func (h *harness) stats(w http.ResponseWriter, r *http.Request) {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	h.mu.Lock()
	n := len(h.servers)
	h.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{
		"apiservers":       n,
		"goroutines":       runtime.NumGoroutine(),
		"rss_bytes":        rssBytes(),
		"heap_alloc_bytes": m.HeapAlloc,
		"heap_sys_bytes":   m.HeapSys,
		"sys_bytes":        m.Sys,
	})
}

// rssBytes reads the resident set size from /proc/self/status (Linux).
func rssBytes() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if fields := strings.Fields(line); len(fields) >= 2 && fields[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			return kb * 1024
		}
	}
	return -1
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}
