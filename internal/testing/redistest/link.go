package redistest

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Link is a network between clients and a Server that a test can cut: a TCP relay on a loopback
// port of its own. A client given Addr instead of the server's reaches the server through it.
type Link struct {
	ln    net.Listener
	to    string
	pipes sync.WaitGroup // the relays, both ways, of every connection

	mu     sync.Mutex
	cut    bool
	held   []func() // what the relays sent on during the cut, in the order they read it
	conns  []net.Conn
	closed bool
}

// Link starts a Link to s, closed when the test ends.
func (s *Server) Link() *Link {
	s.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatalf("redistest: link: %v", err)
	}
	l := &Link{ln: ln, to: s.addr}
	go l.accept()
	s.t.Cleanup(l.close)
	return l
}

// Addr is the link's host:port, for clients.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Cut stops the bytes between the clients and the server, both ways, on every connection open or
// opened later, as a network partition does: nothing is refused or reset, and nothing more
// arrives (but what a relay was already writing). The server keeps running, and its data. A
// client's new connection is accepted by the link, so its dial succeeds where a partition's would
// time out; its first command's answer never comes instead.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = true
}

// Heal delivers what was sent during the cut, late, in the order it was sent across every
// connection (as TCP delivers what a partition held back once it heals), and returns once it is
// delivered; bytes cross freely again. A connection its client closed meanwhile delivers what it
// had sent, then its end.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, send := range l.held {
		send()
	}
	l.held, l.cut = nil, false
}

// pass sends on what a relay read (a write, an end): now, or, the link cut, at Heal.
func (l *Link) pass(send func() error) error {
	l.mu.Lock()
	if !l.cut {
		l.mu.Unlock()
		return send()
	}
	done := make(chan error, 1)
	l.held = append(l.held, func() { done <- send() })
	l.mu.Unlock()
	return <-done
}

func (l *Link) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", l.to)
		if err != nil { // the server is down: its client reads an end at once
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_, _ = c.Close(), s.Close()
			return
		}
		l.conns = append(l.conns, c, s)
		l.pipes.Add(2)
		l.mu.Unlock()
		go l.relay(s, c)
		go l.relay(c, s)
	}
}

// relay copies src to dst through pass, and passes src's end on: its close as dst's write side
// closed, a failure as dst closed.
func (l *Link) relay(dst, src net.Conn) {
	defer l.pipes.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			write := func() error {
				_ = dst.SetWriteDeadline(time.Now().Add(time.Second)) // a peer that reads no more
				_, err := dst.Write(buf[:n])
				return err
			}
			if l.pass(write) != nil {
				break
			}
		}
		if errors.Is(err, io.EOF) {
			_ = l.pass(dst.(*net.TCPConn).CloseWrite)
			return
		}
		if err != nil {
			break
		}
	}
	_ = l.pass(dst.Close)
}

// close ends the link and every connection through it, cut or not, and waits for its relays.
func (l *Link) close() {
	_ = l.ln.Close()
	l.Heal()
	l.mu.Lock()
	l.closed = true
	for _, c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.pipes.Wait()
}
