// Package client is a Go client of the pixlimit API, what an integrator would import: requests
// as the contract sends them (JSON bodies, a fresh Idempotency-Key for every PIX), answers as
// received, errors as values. The demo, the end-to-end drills and the tests all talk to the API
// through it, and DemoAccounts are the contract's demo accounts, written once.
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Client talks to one API address.
type Client struct {
	// BaseURL is the API's address, such as "http://127.0.0.1:8080" (a trailing slash is
	// dropped).
	BaseURL string
	// HTTP sends the requests. Nil: a client that gives up after DefaultTimeout. One of your own
	// needs its Timeout, or every call a context with a deadline: nothing else ends a wait.
	HTTP *http.Client
}

// DefaultTimeout is how long a Client without its own HTTP waits for an answer: every wait has
// a deadline.
const DefaultTimeout = 30 * time.Second

// maxBody bounds what is read of an answer.
const maxBody = 1 << 20

// Response is one answer as received.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	Took   time.Duration
	// Code is the error body's "error" (rate_limit_exceeded, ...) of an answer of status 400 or
	// more, or "": an answer below 400, or one whose body is no error of the API's (a proxy's
	// HTML 502). Judge success by Status.
	Code string
	// IdempotencyKey is the Idempotency-Key the request carried: a PIX's fresh one unless the
	// caller gave its own. Set also when no answer came (the error of PIX): a retry of the same
	// transfer sends it again ("Idempotency-Key", r.IdempotencyKey), and is never paid twice.
	IdempotencyKey string
}

// RetryAfter is the answer's Retry-After in seconds (the API sends no date), or 0 without one.
func (r Response) RetryAfter() time.Duration {
	s, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || s < 0 {
		return 0
	}
	return time.Duration(s) * time.Second
}

// Decode decodes the body into v.
func (r Response) Decode(v any) error {
	if err := json.Unmarshal(r.Body, v); err != nil {
		return fmt.Errorf("client: body %.200q: %w", r.Body, err)
	}
	return nil
}

// String is the status and the body, its tokens masked: a response logged leaks no credential.
func (r Response) String() string {
	return fmt.Sprintf("%d %s", r.Status, tokenValue.ReplaceAll(bytes.TrimSpace(r.Body), []byte(`"$1":"…"`)))
}

// tokenValue matches a login's tokens in a body.
var tokenValue = regexp.MustCompile(`"(access_token|device_token)"\s*:\s*"[^"]*"`)

// Do sends a request and reads its whole answer. Headers come in pairs (name, value); an empty
// value deletes the header. A body that is a string is sent as is, any other is encoded as
// JSON; both with the JSON content type. The error is for no answer at all, or one past 1 MiB:
// an answer with an error status is a Response, its Code set.
func (c *Client) Do(ctx context.Context, method, path string, body any, headers ...string) (Response, error) {
	if len(headers)%2 != 0 {
		return Response{}, fmt.Errorf("client: %s %s: headers %q: want name, value pairs", method, path, headers)
	}
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		buf, err := json.Marshal(b)
		if err != nil {
			return Response{}, fmt.Errorf("client: %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(c.BaseURL, "/")+path, rd)
	if err != nil {
		return Response{}, fmt.Errorf("client: %s %s: %w", method, path, err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	return c.Send(req)
}

// Send sends a prepared request and reads its whole answer, as Do.
func (c *Client) Send(req *http.Request) (Response, error) {
	h := c.HTTP
	if h == nil {
		h = &http.Client{Timeout: DefaultTimeout}
	}
	start := time.Now()
	key := req.Header.Get("Idempotency-Key")
	resp, err := h.Do(req)
	if err != nil {
		return Response{Header: http.Header{}, Took: time.Since(start), IdempotencyKey: key}, fmt.Errorf("client: %s %s: %w", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err == nil && len(b) > maxBody {
		b, err = b[:maxBody], fmt.Errorf("an answer past %d bytes", maxBody)
	}
	r := Response{Status: resp.StatusCode, Header: resp.Header, Body: b, Took: time.Since(start), IdempotencyKey: key}
	if r.Status >= 400 {
		var e struct {
			Error string `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		r.Code = e.Error
	}
	if err != nil {
		return r, fmt.Errorf("client: %s %s: reading the answer: %w", req.Method, req.URL.Path, err)
	}
	return r, nil
}

// Login posts a login.
func (c *Client) Login(ctx context.Context, document, password string, headers ...string) (Response, error) {
	return c.Do(ctx, http.MethodPost, "/v1/login", map[string]string{"document": document, "password": password}, headers...)
}

// Transfer is a PIX to send.
type Transfer struct {
	Key         string `json:"key"`
	AmountCents int64  `json:"amount_cents"`
	Description string `json:"description,omitempty"`
}

// PIX sends t from the token's account under a fresh Idempotency-Key; headers may name another
// ("Idempotency-Key", "k": the same on every retry of one transfer) or none ("Idempotency-Key",
// "").
func (c *Client) PIX(ctx context.Context, token string, t Transfer, headers ...string) (Response, error) {
	return c.Do(ctx, http.MethodPost, "/v1/pix", t,
		append([]string{"Authorization", "Bearer " + token, "Idempotency-Key", NewIdempotencyKey()}, headers...)...)
}

// Statement asks for the token's account's statement, at most limit entries (1 to 100).
func (c *Client) Statement(ctx context.Context, token string, limit int, headers ...string) (Response, error) {
	return c.Do(ctx, http.MethodGet, "/v1/statement?limit="+strconv.Itoa(limit), nil,
		append([]string{"Authorization", "Bearer " + token}, headers...)...)
}

// LookupKey asks who owns a PIX key. An empty key, "." or ".." is an error, not sent: escaped or
// not, it would name another path.
func (c *Client) LookupKey(ctx context.Context, token, key string, headers ...string) (Response, error) {
	if key == "" || key == "." || key == ".." {
		return Response{}, fmt.Errorf("client: look up the PIX key %q: no key", key)
	}
	return c.Do(ctx, http.MethodGet, "/v1/pix/keys/"+url.PathEscape(key), nil,
		append([]string{"Authorization", "Bearer " + token}, headers...)...)
}

// NewIdempotencyKey is a fresh Idempotency-Key: 26 characters of crypto/rand's base32 text.
func NewIdempotencyKey() string { return rand.Text() }

// Account is a demo account as its customer knows it.
type Account struct{ Name, Document, Password, Key string }

// DemoAccounts are the contract's demo accounts (DEMO_ACCOUNTS=true): four persons, Ana, Bruno,
// Carla and Diego, then two companies, a bakery (a numeric CNPJ) and a café (an alphanumeric one).
func DemoAccounts() []Account {
	return []Account{
		{"ana", "529.982.247-25", "demo-ana-123", "ana@example.com"},
		{"bruno", "390.533.447-05", "demo-bruno-123", "bruno@example.com"},
		{"carla", "111.444.777-35", "demo-carla-123", "carla@example.com"},
		{"diego", "935.411.347-80", "demo-diego-123", "diego@example.com"},
		{"padaria", "11.222.333/0001-81", "demo-padaria-123", "padaria@example.com"},
		{"cafe", "12.ABC.345/01DE-35", "demo-cafe-123", "cafe@example.com"},
	}
}
