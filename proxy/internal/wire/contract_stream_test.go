package wire

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestContractStreamedBodyPastMax: with StreamRequestBody, fasthttp reads
// at most MaxRequestBodySize bytes of a body before it calls the handler,
// and a body longer than that still reaches the handler whole through its
// stream (fasthttp's limit then bounds only that first read). keyway sets
// the limit to one chunk (ChunkSize) and bounds bodies itself. Without
// it: every body longer than 4 KiB is refused with 413, or fasthttp holds
// a buffer of what Content-Length announces before keyway sees the
// request (the head-only attack).
func TestContractStreamedBodyPastMax(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	entered := make(chan struct{}, 1)
	srv := &fasthttp.Server{
		StreamRequestBody:  true,
		MaxRequestBodySize: ChunkSize,
		Handler: func(ctx *fasthttp.RequestCtx) {
			entered <- struct{}{}
			n, err := io.Copy(io.Discard, ctx.RequestBodyStream())
			if err != nil {
				ctx.SetStatusCode(500)
				return
			}
			ctx.SetBodyString(strconv.FormatInt(n, 10))
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { ln.Close(); _ = srv.Shutdown() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	const size = 100 << 10
	body := strings.Repeat("x", size)
	// The head and a first part of the body, longer than the limit and
	// shorter than the body: the handler must run before the rest comes.
	if _, err := fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s", size, body[:ChunkSize+1000]); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("contract broken: fasthttp did not call the handler before the whole body arrived; keyway's bodies would be sized by Content-Length again")
	}
	if _, err := io.WriteString(c, body[ChunkSize+1000:]); err != nil {
		t.Fatal(err)
	}
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(c)); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode() != 200 || string(resp.Body()) != strconv.Itoa(size) {
		t.Fatalf("contract broken: a body past MaxRequestBodySize got %d %q through its stream, want 200 and all %d bytes: keyway would refuse every body over 4 KiB", resp.StatusCode(), resp.Body(), size)
	}
}
