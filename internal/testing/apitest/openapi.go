package apitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/pixlimit/pixlimit"
	"github.com/pixlimit/pixlimit/client"
)

// Contract is the contract's documents (docs/openapi.yaml, docs/openapi-admin.yaml), loaded and
// validated once, and their routers.
type Contract struct {
	docs    []*openapi3.T
	routers []routers.Router
}

// LoadContract loads and validates both documents: every reference resolves, every schema is
// one. A document that does not load is a failed test, never a skipped check.
func LoadContract() (*Contract, error) {
	c := &Contract{}
	for _, raw := range [][]byte{pixlimit.OpenAPI, pixlimit.OpenAPIAdmin} {
		loader := openapi3.NewLoader()
		doc, err := loader.LoadFromData(raw)
		if err != nil {
			return nil, fmt.Errorf("openapi: load: %w", err)
		}
		if err := doc.Validate(context.Background()); err != nil {
			return nil, fmt.Errorf("openapi: %s: %w", doc.Info.Title, err)
		}
		doc.Servers = nil // match any host: the tests' servers listen on free ports
		r, err := legacy.NewRouter(doc)
		if err != nil {
			return nil, fmt.Errorf("openapi: router: %w", err)
		}
		// The documents are OpenAPI 3.1, whose schemas kin-openapi checks with a JSON Schema
		// 2020-12 validator that it compiles anew for every value it checks: 1.4 ms a check, 6 ms
		// under the race detector, which made the whole-program tests exceed their budget. Their
		// schemas use no keyword 3.0 lacks (const is written as a one-value enum), so once the
		// document has been validated as 3.1 the checks run on kin-openapi's own validator, which
		// decides them alike, in microseconds. TestTheCheckCanFail proves they still fail what
		// they must.
		doc.OpenAPI = "3.0.3"
		c.docs, c.routers = append(c.docs, doc), append(c.routers, r)
	}
	return c, nil
}

var contract = sync.OnceValues(LoadContract)

// Check checks one exchange against the documents and returns what it found wrong, or nil:
//   - a response must be one the document describes for its route (status, headers, body), or,
//     for a path or method no document has, 404 or 405 with the error body;
//   - a request the document rejects (a malformed body, a missing header, an out-of-range
//     value: the tests send many on purpose) must be answered 4xx, never served.
func (c *Contract) Check(req *http.Request, reqBody []byte, status int, header http.Header, body []byte) error {
	route, params, err := c.find(req)
	if err != nil {
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			return fmt.Errorf("openapi: %s %s is no route of the contract, yet answered %d", req.Method, req.URL.Path, status)
		}
		return errorBody(body)
	}
	opts := &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, IncludeResponseStatus: true, MultiError: true}
	in := &openapi3filter.RequestValidationInput{Request: cloneWithBody(req, reqBody), PathParams: params, Route: route, Options: opts}
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if reqErr != nil && (status < 400 || status >= 500) {
		return fmt.Errorf("openapi: %s %s: the document rejects the request (%v), yet it was answered %d", req.Method, req.URL.Path, reqErr, status)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: status, Header: header, Options: opts}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		return fmt.Errorf("openapi: %s %s answered %d %s, which the document does not describe: %v",
			req.Method, req.URL.Path, status, excerpt(body), err)
	}
	return nil
}

// find is the request's route in the first document that has it.
func (c *Contract) find(req *http.Request) (*routers.Route, map[string]string, error) {
	var last error
	for _, r := range c.routers {
		route, params, err := r.FindRoute(req)
		if err == nil {
			return route, params, nil
		}
		last = err
	}
	return nil, nil, last
}

// codes are the error codes of the public document's Error schema.
func (c *Contract) codes() []string {
	var out []string
	for _, v := range c.docs[0].Components.Schemas["Error"].Value.Properties["error"].Value.Enum {
		out = append(out, fmt.Sprint(v))
	}
	return out
}

// errorBody checks an answer off every route is the contract's error body.
func errorBody(body []byte) error {
	var e struct {
		Error   string `json:"error"`
		Message string `json:"message"`
	}
	c, err := contract()
	if err != nil {
		return err
	}
	if json.Unmarshal(body, &e) != nil || e.Message == "" || !slices.Contains(c.codes(), e.Error) {
		return fmt.Errorf("openapi: an answer off every route is not the error body: %s", excerpt(body))
	}
	return nil
}

// excerpt is the start of a body, for a message.
func excerpt(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}

func cloneWithBody(req *http.Request, body []byte) *http.Request {
	r := req.Clone(context.Background())
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return r
}

// checking is the tests' transport: every request and its answer pass Check, and what it finds
// is reported to the test.
type checking struct {
	next   http.RoundTripper
	report func(format string, args ...any)
}

func (t checking) RoundTrip(req *http.Request) (*http.Response, error) {
	var reqBody []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		req.Body.Close()
		reqBody = b
		req.Body = io.NopCloser(bytes.NewReader(b))
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(body))
	if err != nil {
		return resp, nil // the client reports the broken read
	}
	c, cerr := contract()
	if cerr != nil {
		t.report("%v", cerr)
		return resp, nil
	}
	if req.Method == http.MethodHead || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") && resp.StatusCode == http.StatusRequestEntityTooLarge {
		return resp, nil // no body to check: HEAD, and net/http's own 413 before the handler
	}
	if err := c.Check(req, reqBody, resp.StatusCode, resp.Header, body); err != nil {
		t.report("%v", err)
	}
	return resp, nil
}

// CheckingClient is an HTTP client whose every exchange is checked against the contract and
// whose findings go to report (a test's Errorf).
func CheckingClient(report func(format string, args ...any)) *http.Client {
	return &http.Client{Timeout: client.DefaultTimeout, Transport: checking{next: http.DefaultTransport, report: report}}
}
