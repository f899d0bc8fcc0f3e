package httpapi

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/labstack/echo/v4"
)

// maxBody bounds every request body; a login or a transfer is a few hundred bytes.
const maxBody = 16 << 10

// limitBody refuses a declared Content-Length over maxBody at once and caps every other body
// (chunked ones included) with http.MaxBytesReader, so that reading past the cap fails with
// *http.MaxBytesError and decodeJSON answers 413 whichever way the body came. The login's body
// is only capped: every login counts against its client's IP key (handleLogin decides it before
// answering a body it could not read), so a body too large is counted there, then answered 413.
//
// The body is read within bodyWithin of the headers, too: the server's write timeout counts from
// them, and a request's longest wait and work are what it leaves less a margin (config's
// writeMargin), so a body trickled in for seconds would let a PIX be made whose answer is past it,
// a cut connection. (Read past the deadline, the body is a 400; a login's still counts against
// its IP key. A route that reads no body, sent one anyway, has that long to answer, or its
// client is taken for gone.) A ResponseWriter that cannot set one (a test's recorder) reads as before.
func limitBody(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		req := c.Request()
		if req.ContentLength > maxBody && c.Path() != "/v1/login" {
			return &Error{Code: CodeRequestTooLarge}
		}
		// A request with no body: net/http reads on, to see its client leave. With one, net/http
		// clears the deadline once the body is read to its end, to read on then. (Asked of the
		// writer itself, not an http.ResponseController: a writer that cannot answers it with an
		// error built per request, which a refusal's price would pay: BenchmarkRefusal.)
		if d, ok := c.Response().Writer.(interface{ SetReadDeadline(time.Time) error }); ok && req.ContentLength != 0 {
			_ = d.SetReadDeadline(time.Now().Add(bodyWithin))
		}
		req.Body = http.MaxBytesReader(c.Response(), req.Body, maxBody)
		return next(c)
	}
}

// bodyWithin is how long after its headers a request's body may take to arrive: within the write
// timeout's margin (config's writeMargin), which leaves time to answer too.
const bodyWithin = 800 * time.Millisecond

// decodeJSON reads the request body into v strictly: JSON content type, exactly one JSON object,
// within the body limit, and every member name exactly one of v's fields, once.
//
// It uses the json/v2 semantics (github.com/go-json-experiment/json, the module that became
// encoding/json/v2) rather than encoding/json, which matches names case-insensitively and lets
// a repeated name win: {"amount_cents": 1, "AMOUNT_CENTS": 400000} would move 400000 cents while
// a proxy, a WAF or an audit log read 1. json/v2 rejects duplicate names and matches case
// exactly by default, and RejectUnknownMembers rejects the rest; no hand-written token scanning.
//
// A member whose value is null is 400 too: no field of a request is nullable, and json/v2 would
// read it as the field's zero value (a PIX's "description": null as none). json/v2 has no option
// to refuse it, so nullMember finds one with jsontext's tokenizer, only when "null" appears.
func decodeJSON(c echo.Context, v any) error {
	if err := asJSON(c.Request().Header); err != nil {
		return err
	}
	// One pass: the body read whole (within maxBody), then unmarshalled, which rejects duplicate
	// names, invalid UTF-8 and anything after the object.
	body, err := readBody(c.Request())
	if err == nil {
		switch body = bytes.TrimLeft(body, " \t\r\n"); {
		case len(body) == 0:
			return invalid("request body is required", nil)
		case body[0] != '{':
			return invalid("request body is not a single JSON object", nil)
		}
		err = json.Unmarshal(body, v, json.RejectUnknownMembers(true))
	}
	if err == nil {
		if bytes.Contains(body, []byte("null")) { // rare: walked only then, once every name is known
			if name, ok := nullMember(body); ok {
				return invalid("invalid field", map[string]string{name: "must not be null"})
			}
		}
		return nil
	}
	var ( // declared past the nil case: errors.As moves them to the heap
		tooLarge  *http.MaxBytesError
		semantic  *json.SemanticError
		syntactic *jsontext.SyntacticError
	)
	switch {
	case errors.As(err, &tooLarge):
		return &Error{Code: CodeRequestTooLarge}
	case errors.Is(err, os.ErrDeadlineExceeded): // limitBody's bodyWithin
		return invalid("the request body did not arrive within 0.8 s of its headers", nil)
	case errors.Is(err, jsontext.ErrDuplicateName) && errors.As(err, &syntactic):
		return invalid("duplicate member name", map[string]string{member(string(syntactic.JSONPointer)): "appears more than once"})
	case errors.Is(err, json.ErrUnknownName) && errors.As(err, &semantic):
		return invalid("unknown field", map[string]string{member(string(semantic.JSONPointer)): "unknown field (names are case-sensitive)"})
	case errors.As(err, &semantic) && semantic.JSONPointer != "" && semantic.GoType != nil:
		return invalid("invalid field", map[string]string{member(string(semantic.JSONPointer)): "must be " + jsonKind(semantic.GoType.Kind().String())})
	}
	return invalid("request body is not a single JSON object", nil)
}

// asJSON checks that a request's headers say its body is JSON, as it is sent: one Content-Type,
// application/json, whose charset, if it names one, is UTF-8 (JSON between systems is UTF-8, RFC
// 8259; a body in another would be read as UTF-8 all the same), and no Content-Encoding but
// identity (a gzipped body would be read as garbage; RFC 9110 answers an unsupported coding 415).
// Two Content-Types are none: a proxy may read one, the API the other.
func asJSON(h http.Header) *Error {
	ct := h[echo.HeaderContentType]
	if len(ct) == 1 && ct[0] == echo.MIMEApplicationJSON && len(h[echo.HeaderContentEncoding]) == 0 {
		return nil // the common case, without parsing
	}
	if len(ct) != 1 {
		return &Error{Code: CodeUnsupportedMediaType}
	}
	mt, params, err := mime.ParseMediaType(ct[0])
	if err != nil || mt != echo.MIMEApplicationJSON {
		return &Error{Code: CodeUnsupportedMediaType}
	}
	if cs, named := params["charset"]; named && !strings.EqualFold(cs, "utf-8") {
		return &Error{Code: CodeUnsupportedMediaType, Message: "a JSON body is UTF-8: charset, if sent, must be utf-8"}
	}
	for _, v := range h.Values(echo.HeaderContentEncoding) {
		for coding := range strings.SplitSeq(v, ",") {
			if coding = strings.TrimSpace(coding); coding != "" && !strings.EqualFold(coding, "identity") {
				return &Error{Code: CodeUnsupportedMediaType, Message: "Content-Encoding is not supported: send the body as is"}
			}
		}
	}
	return nil
}

// nullMember is the name of body's first top-level member whose value is null, if body is an
// object that has one; anything else malformed is left to json.Unmarshal to name.
func nullMember(body []byte) (string, bool) {
	d := jsontext.NewDecoder(bytes.NewReader(body))
	if t, err := d.ReadToken(); err != nil || t.Kind() != '{' {
		return "", false
	}
	for d.PeekKind() == '"' {
		t, err := d.ReadToken()
		if err != nil {
			return "", false
		}
		if name := t.String(); d.PeekKind() == 'n' { // the name read before the next call voids it
			return name, true
		}
		if err := d.SkipValue(); err != nil {
			return "", false
		}
	}
	return "", false
}

// readBody reads r's body whole, into a buffer of the length it declares when it declares one:
// a login is a few dozen bytes, where io.ReadAll starts at 512. A body that runs past its
// declared length (net/http's server never gives one) is read on to its end.
func readBody(r *http.Request) ([]byte, error) {
	n := r.ContentLength
	if n <= 0 || n > maxBody {
		return io.ReadAll(r.Body)
	}
	body := make([]byte, n+1)
	switch got, err := io.ReadFull(r.Body, body); {
	case got == int(n) && errors.Is(err, io.ErrUnexpectedEOF):
		return body[:n], nil
	case err != nil:
		return body[:got], err
	}
	rest, err := io.ReadAll(r.Body)
	return append(body, rest...), err
}

// member is the top-level member name a JSON Pointer ("/amount_cents") points into.
func member(pointer string) string {
	name, _, _ := strings.Cut(strings.TrimPrefix(pointer, "/"), "/")
	name = strings.NewReplacer("~1", "/", "~0", "~").Replace(name)
	if name == "" {
		return "body"
	}
	return name
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int64", "int":
		return "an integer within range"
	case "string":
		return "a string"
	}
	return "a " + goKind
}
