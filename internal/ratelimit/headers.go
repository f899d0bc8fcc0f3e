package ratelimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// SetHeaders writes a decision to h as the contract's headers, after the IETF draft
// "RateLimit header fields for HTTP" and the older, widely parsed RateLimit-Limit/-Remaining/
// -Reset triple:
//
//	RateLimit-Limit: 10
//	RateLimit-Remaining: 7
//	RateLimit-Reset: 42
//	RateLimit-Policy: "pix";q=10;w=60
//	RateLimit: "pix";r=7;t=42
//
// RateLimit-Policy lists every policy checked; everything else reports the worst one. Times are
// whole seconds rounded up, so a client that waits what it is told is never early. A refused
// decision also gets Retry-After, equal to RateLimit-Reset.
func SetHeaders(h http.Header, d Decision) {
	w := d.Result
	h.Set("RateLimit-Limit", strconv.Itoa(w.Limit))
	h.Set("RateLimit-Remaining", strconv.Itoa(w.Remaining))
	h.Set("RateLimit-Reset", strconv.FormatInt(seconds(w.Reset), 10))

	var p strings.Builder
	for i, r := range d.Results {
		if i > 0 {
			p.WriteString(", ")
		}
		p.WriteString(`"` + r.Policy.Name + `";q=` + strconv.Itoa(r.Policy.Limit) +
			";w=" + strconv.FormatInt(seconds(r.Policy.Window), 10))
		if r.Policy.algorithm().bursty() {
			p.WriteString(";burst=" + strconv.Itoa(r.Limit))
		}
	}
	h.Set("RateLimit-Policy", p.String())
	h.Set("RateLimit", `"`+w.Policy.Name+`";r=`+strconv.Itoa(w.Remaining)+
		";t="+strconv.FormatInt(seconds(w.Reset), 10))

	if !d.Allowed {
		h.Set("Retry-After", strconv.FormatInt(retrySeconds(d.RetryAfter), 10))
	}
}

// seconds rounds d up to whole seconds.
func seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// retrySeconds is seconds(d) but at least 1: "Retry-After: 0" would invite an immediate retry
// that the limiter refuses again.
func retrySeconds(d time.Duration) int64 {
	return max(1, seconds(d))
}
