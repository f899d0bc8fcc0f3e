package main

import (
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// event is one thing the demo said, did or saw. The narrator makes one for every line it prints
// and hands it to the hub, so the terminal and the page (-serve) tell one story from one stream:
// the page can never show what the terminal did not.
type event struct {
	Seq      int     `json:"seq"`
	At       float64 `json:"at"`   // seconds since the run began
	Kind     string  `json:"kind"` // intro, title, say, wait, call, verdict, decision, stats, done
	Scenario string  `json:"scenario,omitempty"`
	Text     string  `json:"text,omitempty"`

	// call: one request and its answer.
	Replica    int    `json:"replica,omitempty"`
	IP         string `json:"ip,omitempty"`
	Who        string `json:"who,omitempty"`     // the account or the login's document, when known
	Memory     bool   `json:"memory,omitempty"`  // decided in the replica's memory, without Redis
	Scripts    *int   `json:"scripts,omitempty"` // the Redis calls its limiter made for it; absent when unknown
	Method     string `json:"method,omitempty"`
	Path       string `json:"path,omitempty"`
	Status     int    `json:"status,omitempty"`
	Code       string `json:"code,omitempty"`
	Remaining  string `json:"remaining,omitempty"`
	RetryAfter string `json:"retry_after,omitempty"`
	Policy     string `json:"policy,omitempty"` // RateLimit-Policy, as sent: every key decided
	Worst      string `json:"worst,omitempty"`  // the key RateLimit names: the one reported, the refusing one of a 429
	Waited     string `json:"waited,omitempty"` // ms the request waited for its turn in a queue (Server-Timing)

	// verdict: an expectation and what was seen.
	OK       bool   `json:"ok,omitempty"`
	Observed string `json:"observed,omitempty"`

	// decision: one request of the algorithm lesson, straight on the limiter.
	Algorithm string `json:"algorithm,omitempty"`
	Phase     string `json:"phase,omitempty"` // before, after (the boundary); burst, refill (the buckets)
	Allowed   bool   `json:"allowed,omitempty"`

	// stats: the in-process limiters' counters.
	RedisCalls  int64 `json:"redis_calls,omitempty"`
	DenyCached  int64 `json:"cached_refusals,omitempty"` // refused by a deny cache, no Redis call
	BreakerOpen bool  `json:"breaker_open,omitempty"`
}

// hub keeps every event of the run and hands them to the page's streams: all so far, then each
// as it comes.
type hub struct {
	start time.Time

	mu     sync.Mutex
	events []event
	subs   map[chan event]bool
}

func newHub() *hub { return &hub{start: time.Now(), subs: map[chan event]bool{}} }

// publish stamps e and sends it to every stream; a stream too slow to take it is dropped (the
// page reconnects and replays from the start).
func (h *hub) publish(e event) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	e.Seq, e.At = len(h.events), time.Since(h.start).Seconds()
	h.events = append(h.events, e)
	for ch := range h.subs {
		select {
		case ch <- e:
		default:
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// subscribe returns the events so far and a channel of the next ones.
func (h *hub) subscribe() ([]event, chan event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan event, 4096)
	h.subs[ch] = true
	return append([]event(nil), h.events...), ch
}

func (h *hub) unsubscribe(ch chan event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs[ch] {
		delete(h.subs, ch)
		close(ch)
	}
}

//go:embed web
var web embed.FS

// serve serves the page and its event stream on addr until the returned stop is called. The
// page, its script and its style are embedded: nothing is built or fetched at run time.
func (h *hub) serve(addr string) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("-serve: %w", err)
	}
	static, _ := fs.Sub(web, "web")
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(static))
	mux.HandleFunc("GET /events", h.stream)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/", func() { _ = srv.Close() }, nil
}

// stream is the page's Server-Sent Events: every event so far, then each new one, as JSON.
func (h *hub) stream(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	past, ch := h.subscribe()
	defer h.unsubscribe(ch)
	// A reconnecting page says what it has (Last-Event-ID): only the rest is sent.
	after := -1
	if id, err := strconv.Atoi(r.Header.Get("Last-Event-ID")); err == nil {
		after = id
	}
	send := func(e event) error {
		b, _ := json.Marshal(e)
		_, err := fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b)
		return err
	}
	for _, e := range past {
		if e.Seq <= after {
			continue
		}
		if send(e) != nil {
			return
		}
	}
	flusher.Flush()
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	for {
		select {
		case e, ok := <-ch:
			if !ok || send(e) != nil {
				return
			}
			flusher.Flush()
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			flusher.Flush()
		case <-r.Context().Done():
			return
		}
	}
}
