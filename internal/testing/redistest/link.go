package redistest

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Link is a network between clients and a Server that a test can cut: a TCP relay on a loopback
// port of its own. A client given Addr instead of the server's reaches the server through it.
type Link struct {
	t  testing.TB
	ln net.Listener
	to string

	mu    sync.Mutex
	flows chan struct{} // closed while bytes cross; a Cut replaces it with an open one
	conns []net.Conn
}

// Link starts a Link to s, closed when the test ends.
func (s *Server) Link() *Link {
	s.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.t.Fatalf("redistest: link: %v", err)
	}
	l := &Link{t: s.t, ln: ln, to: s.addr, flows: make(chan struct{})}
	close(l.flows)
	go l.accept()
	s.t.Cleanup(l.close)
	return l
}

// Addr is the link's host:port, for clients.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Cut stops every byte between the clients and the server, both ways, on every connection open
// or opened later, as a network partition does: nothing is refused or reset, nothing arrives.
// The server keeps running, and keeps its data.
func (l *Link) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.flows:
		l.flows = make(chan struct{})
	default: // already cut
	}
}

// Heal lets bytes cross again. What was sent during the cut arrives now, late, in order on each
// connection, as TCP delivers what a partition held back once it heals; a connection its client
// closed meanwhile delivers what it had sent, then closes.
func (l *Link) Heal() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.flows:
	default:
		close(l.flows)
	}
}

// wait returns once bytes may cross.
func (l *Link) wait() {
	l.mu.Lock()
	flows := l.flows
	l.mu.Unlock()
	<-flows
}

func (l *Link) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return // closed
		}
		s, err := net.Dial("tcp", l.to)
		if err != nil { // the server is down: as it would, refuse the client by closing
			_ = c.Close()
			continue
		}
		l.mu.Lock()
		l.conns = append(l.conns, c, s)
		l.mu.Unlock()
		var both sync.WaitGroup
		both.Go(func() { l.relay(s, c) })
		both.Go(func() { l.relay(c, s) })
		go func() { both.Wait(); _ = c.Close(); _ = s.Close() }()
	}
}

// relay copies src to dst, each read held at the cut until it heals, and passes src's end on.
func (l *Link) relay(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		l.wait()
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			if err == io.EOF {
				_ = dst.(*net.TCPConn).CloseWrite()
				return
			}
			break
		}
	}
	_ = dst.Close()
}

// close ends the link and every connection through it, cut or not.
func (l *Link) close() {
	_ = l.ln.Close()
	l.Heal()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		_ = c.Close()
	}
}
