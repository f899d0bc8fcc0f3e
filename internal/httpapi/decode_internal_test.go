package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
)

// TestDecodeJSONAnswers: each kind of bad body gets its own answer (status, message and the
// field it names), and a good one decodes.
func TestDecodeJSONAnswers(t *testing.T) {
	type pix struct {
		Key    string `json:"key"`
		Amount int64  `json:"amount_cents"`
	}
	tests := []struct {
		body, contentType string
		code              Code
		message, field    string
	}{
		{`{"key":"k","amount_cents":1}`, "application/json", "", "", ""},
		{` {"key":"k"} ` + "\n", "application/json; charset=utf-8", "", "", ""},
		{``, "application/json", CodeInvalidRequest, "request body is required", ""},
		{"  \n", "application/json", CodeInvalidRequest, "request body is required", ""},
		{`[1]`, "application/json", CodeInvalidRequest, "request body is not a single JSON object", ""},
		{`null`, "application/json", CodeInvalidRequest, "request body is not a single JSON object", ""},
		{`{"key":"k"} {}`, "application/json", CodeInvalidRequest, "request body is not a single JSON object", ""},
		{`{"key":"k"`, "application/json", CodeInvalidRequest, "request body is not a single JSON object", ""},
		{`{"key":"k","key":"j"}`, "application/json", CodeInvalidRequest, "duplicate member name", "key"},
		{`{"key":"k","from":"x"}`, "application/json", CodeInvalidRequest, "unknown field", "from"},
		{`{"KEY":"k"}`, "application/json", CodeInvalidRequest, "unknown field", "KEY"},
		{`{"amount_cents":"1"}`, "application/json", CodeInvalidRequest, "invalid field", "amount_cents"},
		{"{\"key\":\"\xff\"}", "application/json", CodeInvalidRequest, "request body is not a single JSON object", ""},
		{`{"key":"` + strings.Repeat("k", maxBody) + `"}`, "application/json", CodeRequestTooLarge, "", ""},
		{`{"key":"k"}`, "text/plain", CodeUnsupportedMediaType, "", ""},
		{`{"key":"k"}`, "", CodeUnsupportedMediaType, "", ""},
		{`{"key":"k"}`, "application/json; charset=UTF-8", "", "", ""},
		{`{"key":"k"}`, "application/json; charset=utf-16", CodeUnsupportedMediaType, "a JSON body is UTF-8: charset, if sent, must be utf-8", ""},
		{`{"key":"k"}`, "application/json; charset=latin1", CodeUnsupportedMediaType, "", ""},
		{`{"key":"k","amount_cents":null}`, "application/json", CodeInvalidRequest, "invalid field", "amount_cents"},
		{`{"amount_cents":1, "key" : null }`, "application/json", CodeInvalidRequest, "invalid field", "key"},
		{`{"key":"null","amount_cents":1}`, "application/json", "", "", ""},
		{`{"key":"k","from":null}`, "application/json", CodeInvalidRequest, "unknown field", "from"},
		{`{"KEY":null}`, "application/json", CodeInvalidRequest, "unknown field", "KEY"},
	}
	e := echo.New()
	for _, tt := range tests {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tt.body))
		if tt.contentType != "" {
			req.Header.Set("Content-Type", tt.contentType)
		}
		rec := httptest.NewRecorder()
		req.Body = http.MaxBytesReader(rec, req.Body, maxBody)
		var v pix
		err := decodeJSON(e.NewContext(req, rec), &v)
		var got Error
		if err != nil {
			got = *toError(err, 0)
		}
		if got.Code != tt.code || tt.message != "" && got.Message != tt.message {
			t.Errorf("%.40q: %s %q, want %s %q", tt.body, got.Code, got.Message, tt.code, tt.message)
		}
		if _, ok := got.Fields[tt.field]; tt.field != "" && !ok {
			t.Errorf("%.40q: fields %v, want %q named", tt.body, got.Fields, tt.field)
		}
		if tt.code == "" && v.Key != "k" && v.Key != "null" {
			t.Errorf("%.40q: decoded %+v", tt.body, v)
		}
	}
}

// TestReadBody: a body is read whole whatever length it declares: its own, none, more than it
// holds (cut short: an error), or less than it holds (read on).
func TestReadBody(t *testing.T) {
	const body = `{"document":"x"}`
	for _, tt := range []struct {
		name     string
		declared int64
		want     string
		fails    bool
	}{
		{"its length", int64(len(body)), body, false},
		{"none", -1, body, false},
		{"more than it holds", int64(len(body)) + 5, body, true},
		{"less than it holds", 3, body, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
			req.ContentLength = tt.declared
			got, err := readBody(req)
			if string(got) != tt.want || (err != nil) != tt.fails {
				t.Errorf("readBody = %q, %v; want %q, failing %v", got, err, tt.want, tt.fails)
			}
		})
	}
}

// TestDecodeJSONReadsOneJSONBodyAsSent: two Content-Types, or a body sent compressed, are 415
// whichever order they come in; identity is no coding.
func TestDecodeJSONReadsOneJSONBodyAsSent(t *testing.T) {
	for _, tt := range []struct {
		name    string
		headers [][2]string
		code    Code
	}{
		{"JSON, then text", [][2]string{{"Content-Type", "application/json"}, {"Content-Type", "text/plain"}}, CodeUnsupportedMediaType},
		{"text, then JSON", [][2]string{{"Content-Type", "text/plain"}, {"Content-Type", "application/json"}}, CodeUnsupportedMediaType},
		{"JSON twice", [][2]string{{"Content-Type", "application/json"}, {"Content-Type", "application/json"}}, CodeUnsupportedMediaType},
		{"gzip", [][2]string{{"Content-Type", "application/json"}, {"Content-Encoding", "gzip"}}, CodeUnsupportedMediaType},
		{"identity, then br", [][2]string{{"Content-Type", "application/json"}, {"Content-Encoding", "identity, br"}}, CodeUnsupportedMediaType},
		{"identity", [][2]string{{"Content-Type", "application/json"}, {"Content-Encoding", "Identity"}}, ""},
	} {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(`{"key":"k"}`))
		for _, h := range tt.headers {
			req.Header.Add(h[0], h[1])
		}
		var v struct {
			Key string `json:"key"`
		}
		var got Code
		if err := decodeJSON(echo.New().NewContext(req, httptest.NewRecorder()), &v); err != nil {
			got = toError(err, 0).Code
		}
		if got != tt.code {
			t.Errorf("%s: %q, want %q", tt.name, got, tt.code)
		}
	}
}
