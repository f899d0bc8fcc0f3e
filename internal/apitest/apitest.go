// Package apitest is a test client of the pixlimit API over real HTTP: requests, logins,
// transfers and statements as a client sends them, the contract's demo accounts, and the small
// tools that tests of a running API or of a fleet of replicas share.
package apitest

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pixlimit/pixlimit/internal/pix"
)

// httpClient gives up on a request after 30 s: a test of an API that hangs fails instead of
// hanging.
var httpClient = &http.Client{Timeout: 30 * time.Second}

// Client talks to one API replica at Base.
type Client struct {
	T    testing.TB
	Base string // "http://127.0.0.1:port"
}

// Response is what a test looks at: status, headers, the raw body and how long it took.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	Took   time.Duration
}

// JSON decodes the body as a JSON object, failing the test otherwise (with Errorf, so that a
// worker goroutine may call it: testing forbids FailNow outside the test's own; the map is then
// nil, and the checks that follow fail too).
func (r Response) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Errorf("body %q is not a JSON object: %v", r.Body, err)
	}
	return m
}

func (r Response) String() string {
	return fmt.Sprintf("%d %s", r.Status, bytes.TrimSpace(r.Body))
}

// Do sends a request; headers come in pairs (name, value), an empty value deleting the header. A
// body that is not a string is encoded as JSON; a string is sent as is; both with the JSON
// content type.
func (c *Client) Do(method, path string, body any, headers ...string) Response {
	c.T.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			c.T.Errorf("%s %s: %v", method, path, err)
			return Response{Header: http.Header{}}
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, c.Base+path, rd)
	if err != nil {
		c.T.Errorf("%s %s: %v", method, path, err)
		return Response{Header: http.Header{}}
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	return c.Send(req)
}

// Send sends a prepared request and reads the whole answer. A request that gets no answer fails
// the test with Errorf, not Fatal, so that Burst's workers may send (testing forbids FailNow
// outside the test's goroutine), and returns a Response of status 0.
func (c *Client) Send(req *http.Request) Response {
	c.T.Helper()
	start := time.Now()
	resp, err := httpClient.Do(req)
	if err != nil {
		c.T.Errorf("%s %s: %v", req.Method, req.URL.Path, err)
		return Response{Header: http.Header{}, Took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.T.Errorf("%s %s: reading the answer: %v", req.Method, req.URL.Path, err)
	}
	return Response{Status: resp.StatusCode, Header: resp.Header, Body: b, Took: time.Since(start)}
}

// Login posts a login.
func (c *Client) Login(document, password string, headers ...string) Response {
	c.T.Helper()
	return c.Do(http.MethodPost, "/v1/login", map[string]string{"document": document, "password": password}, headers...)
}

// Token logs in and returns the access token, failing the test otherwise (Errorf, and "").
func (c *Client) Token(document, password string, headers ...string) string {
	c.T.Helper()
	r := c.Login(document, password, headers...)
	if r.Status != http.StatusOK {
		c.T.Errorf("login %s: %v", document, r)
		return ""
	}
	tok, _ := r.JSON(c.T)["access_token"].(string)
	return tok
}

// PIX sends cents to key from the token's account under a fresh Idempotency-Key, as a careful
// client names each transfer; headers may name another ("Idempotency-Key", "k") or none
// ("Idempotency-Key", "").
func (c *Client) PIX(token string, key string, cents int64, headers ...string) Response {
	c.T.Helper()
	return c.Do(http.MethodPost, "/v1/pix", map[string]any{"key": key, "amount_cents": cents},
		append([]string{"Authorization", "Bearer " + token, "Idempotency-Key", NewIdempotencyKey()}, headers...)...)
}

// NewIdempotencyKey is a fresh Idempotency-Key: 26 characters of crypto/rand's base32 text.
func NewIdempotencyKey() string { return rand.Text() }

// Statement asks for the token's account's statement, up to 100 entries.
func (c *Client) Statement(token string) Response {
	c.T.Helper()
	return c.Do(http.MethodGet, "/v1/statement?limit=100", nil, "Authorization", "Bearer "+token)
}

// Balance is the token's account's balance, failing the test (-1) if the statement fails.
func (c *Client) Balance(token string) int64 {
	c.T.Helper()
	r := c.Statement(token)
	if r.Status != http.StatusOK {
		c.T.Errorf("statement: %v", r)
		return -1
	}
	b, _ := r.JSON(c.T)["balance_cents"].(float64)
	return int64(b)
}

// Burst sends n requests at once, request i to replica i mod len(replicas), and counts statuses.
func Burst(replicas []*Client, n int, send func(c *Client, i int) Response) map[int]int {
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := send(replicas[i%len(replicas)], i)
			mu.Lock()
			statuses[r.Status]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return statuses
}

// Account is a demo account as a client knows it.
type Account struct{ Name, Document, Password, Key string }

// Demo holds the contract's demo accounts: Ana, Bruno, Carla, Diego.
var Demo = []Account{
	{"ana", "529.982.247-25", "demo-ana-123", "ana@example.com"},
	{"bruno", "390.533.447-05", "demo-bruno-123", "bruno@example.com"},
	{"carla", "111.444.777-35", "demo-carla-123", "carla@example.com"},
	{"diego", "935.411.347-80", "demo-diego-123", "diego@example.com"},
}

// CPF returns the n-th valid CPF made from the 9-digit base 100000000+n; none is an account.
func CPF(n int) string {
	c, err := pix.CompleteCPF(strconv.Itoa(100000000 + n))
	if err != nil {
		panic(err)
	}
	return c
}

// FreeAddr returns a loopback address nothing listens on.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return FreeAddrs(t, 1)[0]
}

// FreeAddrs returns n distinct loopback addresses nothing listens on. Calling FreeAddr n times
// is not the same: the kernel may hand a port just closed to the next bind(0), and a program
// that binds with SO_REUSEPORT (HAProxy does) would then share one port between two listeners.
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close() // held until all n are chosen, so no two are the same
		addrs[i] = l.Addr().String()
	}
	return addrs
}

// Logs collects a server's logs from its goroutines.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *Logs) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *Logs) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}
