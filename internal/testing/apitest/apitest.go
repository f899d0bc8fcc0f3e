// Package apitest is the tests' wrapper of the pixlimit client (package client): the same
// requests, with every failure to get an answer reported to the test, and the small tools that
// tests of a running API or of a fleet of replicas share.
package apitest

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/pixlimit/pixlimit/client"
	"github.com/pixlimit/pixlimit/internal/pix"
)

// Client talks to one API replica at Base: client.Client, with each failure to get an answer
// reported to T, and every request and answer checked against the contract's OpenAPI document.
type Client struct {
	T    testing.TB
	Base string // "http://127.0.0.1:port"
}

// Response is what a test looks at: status, headers, the raw body and how long it took.
type Response struct{ client.Response }

// JSON decodes the body as a JSON object, failing the test otherwise (with Errorf, so that a
// worker goroutine may call it: testing forbids FailNow outside the test's own; the map is then
// nil, and the checks that follow fail too).
func (r Response) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := r.Decode(&m); err != nil {
		t.Errorf("%v", err)
	}
	return m
}

// api is the client of c: every exchange checked against the contract (docs/openapi.yaml), each
// finding a failed test.
func (c *Client) api() *client.Client {
	return &client.Client{BaseURL: c.Base, HTTP: CheckingClient(c.T.Errorf)}
}

// Do sends a request (client.Client.Do). A request that gets no answer fails the test with
// Errorf, not Fatal, so that Burst's workers may send (testing forbids FailNow outside the
// test's goroutine), and returns a Response of status 0.
func (c *Client) Do(method, path string, body any, headers ...string) Response {
	c.T.Helper()
	r, err := c.api().Do(context.Background(), method, path, body, headers...)
	if err != nil {
		c.T.Errorf("%v", err)
	}
	return Response{r}
}

// Send sends a prepared request and reads the whole answer, as Do.
func (c *Client) Send(req *http.Request) Response {
	c.T.Helper()
	r, err := c.api().Send(req)
	if err != nil {
		c.T.Errorf("%v", err)
	}
	return Response{r}
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
	r, err := c.api().PIX(context.Background(), token, client.Transfer{Key: key, AmountCents: cents}, headers...)
	if err != nil {
		c.T.Errorf("%v", err)
	}
	return Response{r}
}

// NewIdempotencyKey is a fresh Idempotency-Key (client.NewIdempotencyKey).
func NewIdempotencyKey() string { return client.NewIdempotencyKey() }

// Statement asks for the token's account's statement, up to 100 entries.
func (c *Client) Statement(token string) Response {
	c.T.Helper()
	r, err := c.api().Statement(context.Background(), token, 100)
	if err != nil {
		c.T.Errorf("%v", err)
	}
	return Response{r}
}

// Balance is the token's account's balance, failing the test (-1) if the statement fails.
func (c *Client) Balance(token string) int64 {
	c.T.Helper()
	r := UntilAnswered(c.T, func() Response { return c.Statement(token) })
	if r.Status != http.StatusOK {
		c.T.Errorf("statement: %v", r)
		return -1
	}
	b, _ := r.JSON(c.T)["balance_cents"].(float64)
	return int64(b)
}

// UntilAnswered sends a request again while it is answered 503 ledger_unavailable, as a client
// told to retry does: a ledger call that missed a short DB_TIMEOUT on a loaded machine is no
// failure of the test. It waits 50 ms between tries (not the Retry-After), for 10 s at most, and
// returns the last answer. Only for a request that is safe to repeat (a read, or a PIX under its
// Idempotency-Key).
func UntilAnswered(t testing.TB, send func() Response) Response {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := send()
		if r.Status != http.StatusServiceUnavailable || r.JSON(t)["error"] != "ledger_unavailable" || time.Now().After(deadline) {
			return r
		}
		time.Sleep(50 * time.Millisecond)
	}
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

// PasswordCost is the bcrypt cost of the test replicas' passwords: bcrypt's least, since under
// the race detector a comparison at a real deployment's cost takes more than a second of CPU.
const PasswordCost = bcrypt.MinCost

// DemoAccounts are the ledger's demo accounts, hashed at PasswordCost.
func DemoAccounts(t testing.TB) []pix.Account {
	t.Helper()
	accounts, err := pix.DemoAccounts(PasswordCost)
	if err != nil {
		t.Fatal(err)
	}
	return accounts
}

// Demo holds the contract's demo accounts: Ana, Bruno, Carla, Diego (client.DemoAccounts).
var Demo = client.DemoAccounts()

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
// is not the same: a program that binds with SO_REUSEPORT (HAProxy does) could share one port
// between two listeners. The ports are drawn below Linux's ephemeral range (32768 and up by
// default), which the kernel hands to bind(0) and to every outgoing connection: a port it chose
// and the test closed could be taken by a connection of another test before the program under
// test binds it ("address already in use").
func FreeAddrs(t testing.TB, n int) []string {
	t.Helper()
	addrs := make([]string, n)
	for i := range addrs {
		var l net.Listener
		for try := 0; l == nil; try++ {
			port := 20000 + rand.IntN(12000)
			if !handOut(port) {
				continue // this process handed it out already: its program may not have bound it yet
			}
			var err error
			if l, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err != nil && try >= 100 {
				t.Fatal(err)
			}
		}
		defer l.Close() // held until all n are chosen, so no two are the same
		addrs[i] = l.Addr().String()
	}
	return addrs
}

// handedOut are the ports FreeAddrs gave in this test process: never twice, so two tests of one
// package never race for a port between its choice and its program's bind.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// handOut reserves port for this process, or reports that it was handed out before.
func handOut(port int) bool {
	handedOut.Lock()
	defer handedOut.Unlock()
	if handedOut.ports == nil {
		handedOut.ports = map[int]bool{}
	}
	if handedOut.ports[port] {
		return false
	}
	handedOut.ports[port] = true
	return true
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
