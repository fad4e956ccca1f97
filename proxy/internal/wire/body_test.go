package wire

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// budget is a Budget with a bound, counting what it holds.
type budget struct{ held, max int64 }

func (b *budget) Take(n int64) bool { b.held += n; return b.held <= b.max }
func (b *budget) Give(n int64)      { b.held -= n }

// TestBodyWholeWithinBuffer: a body that fits is read whole, replayable,
// and its bytes are the client's, however the client's reads end.
func TestBodyWholeWithinBuffer(t *testing.T) {
	for _, n := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, 3*ChunkSize + 7} {
		src := bytes.Repeat([]byte("0123456789abcdef"), n/16+1)[:n]
		for name, r := range map[string]io.Reader{
			"whole":     bytes.NewReader(src),
			"one byte":  iotest.OneByteReader(bytes.NewReader(src)),
			"half read": iotest.HalfReader(bytes.NewReader(src)),
		} {
			bg := &budget{max: 1 << 30}
			var b Body
			if err := b.Fill(r, int64(n), 1<<20, 64<<10, bg); err != nil {
				t.Fatalf("%d bytes, %s: %v", n, name, err)
			}
			if !b.Whole() || b.Size() != int64(n) || b.Len() != n {
				t.Fatalf("%d bytes, %s: whole %v size %d len %d", n, name, b.Whole(), b.Size(), b.Len())
			}
			if want := int64((n + ChunkSize - 1) / ChunkSize * ChunkSize); bg.held != want {
				t.Fatalf("%d bytes: budget holds %d, want %d (one chunk per %d bytes arrived)", n, bg.held, want, ChunkSize)
			}
			for range 2 { // sent, then sent again
				if !b.Rewind() {
					t.Fatal("a whole body cannot be rewound")
				}
				got, err := io.ReadAll(&b)
				if err != nil || !bytes.Equal(got, src) {
					t.Fatalf("%d bytes, %s: read %d bytes, %v", n, name, len(got), err)
				}
			}
			if bs := b.Bytes(); n <= ChunkSize && !bytes.Equal(bs, src) || n > ChunkSize && bs != nil {
				t.Fatalf("%d bytes: Bytes %d bytes", n, len(bs))
			}
			b.Release()
			if bg.held != 0 {
				t.Fatalf("budget holds %d after Release", bg.held)
			}
		}
	}
}

// TestBodyStreamedPastBuffer: a body longer than the buffer is buffered up
// to it, streamed after, byte-exact; it can be rewound until a byte beyond
// the buffer was read, never after.
func TestBodyStreamedPastBuffer(t *testing.T) {
	const n = 200 << 10
	src := bytes.Repeat([]byte("keyway!"), n/7+1)[:n]
	for _, size := range []int64{n, -1} { // Content-Length, chunked
		bg := &budget{max: 1 << 30}
		var b Body
		if err := b.Fill(iotest.HalfReader(bytes.NewReader(src)), size, 1<<20, 32<<10, bg); err != nil {
			t.Fatal(err)
		}
		if b.Whole() || b.Len() != 32<<10 || b.Size() != size {
			t.Fatalf("size %d: whole %v len %d size %d", size, b.Whole(), b.Len(), b.Size())
		}
		if bg.held != 32<<10 {
			t.Fatalf("budget holds %d, want the buffer's 32 KiB", bg.held)
		}
		// An attempt that read only buffered bytes can be made again.
		head := make([]byte, 4<<10)
		if _, err := io.ReadFull(&b, head); err != nil || b.Streamed() {
			t.Fatalf("read within the buffer: %v, streamed %v", err, b.Streamed())
		}
		if !b.Rewind() {
			t.Fatal("no rewind after reading only buffered bytes")
		}
		got, err := io.ReadAll(&b)
		if err != nil || !bytes.Equal(got, src) {
			t.Fatalf("size %d: streamed %d bytes, %v", size, len(got), err)
		}
		if !b.Streamed() || b.Rewind() {
			t.Fatal("a body streamed past its buffer can be rewound")
		}
		if b.BytesRead() != n {
			t.Fatalf("BytesRead %d, want %d", b.BytesRead(), n)
		}
		b.Release()
	}
}

// TestBodyAllocatesByArrival: the buffer grows with the bytes that
// arrive, not with the length announced; a client that stops sending
// holds one chunk.
func TestBodyAllocatesByArrival(t *testing.T) {
	bg := &budget{max: 1 << 30}
	var b Body
	stalled := errors.New("stalled")
	r := io.MultiReader(strings.NewReader("abc"), iotest.ErrReader(stalled))
	if err := b.Fill(r, 8<<20, 16<<20, 1<<20, bg); !errors.Is(err, stalled) || !errors.Is(b.Err(), stalled) {
		t.Fatalf("Fill: %v, Err %v, want the stream's error", err, b.Err())
	}
	if bg.held != ChunkSize {
		t.Fatalf("budget holds %d for 3 bytes that arrived, want one chunk (%d)", bg.held, ChunkSize)
	}
	b.Release()
}

// TestBodyBudget: a chunk that would take the budget past its bound is
// not allocated: ErrBudget, and Release gives everything back.
func TestBodyBudget(t *testing.T) {
	bg := &budget{max: 2 * ChunkSize}
	var b Body
	err := b.Fill(bytes.NewReader(make([]byte, 5*ChunkSize)), 5*ChunkSize, 1<<20, 1<<20, bg)
	if !errors.Is(err, ErrBudget) {
		t.Fatalf("Fill: %v, want ErrBudget", err)
	}
	if b.chunks[2] != nil {
		t.Fatal("a chunk beyond the budget was allocated")
	}
	b.Release()
	if bg.held != 0 {
		t.Fatalf("budget holds %d after Release", bg.held)
	}
}

// TestBodyLimit: a Content-Length over the limit is refused before
// anything is read; a body of unknown length is refused once it passes
// the limit, buffered or streamed; a short body is an error.
func TestBodyLimit(t *testing.T) {
	var b Body
	r := strings.NewReader("never read")
	if err := b.Fill(r, 1001, 1000, 64<<10, nil); !errors.Is(err, ErrBodyTooLarge) || r.Len() != len("never read") {
		t.Fatalf("Content-Length over the limit: %v, %d bytes read", err, len("never read")-r.Len())
	}
	b.Release()
	if err := b.Fill(bytes.NewReader(make([]byte, 2000)), -1, 1000, 64<<10, nil); !errors.Is(err, ErrBodyTooLarge) {
		t.Fatalf("chunked past the limit within the buffer: %v", err)
	}
	b.Release()
	if err := b.Fill(bytes.NewReader(make([]byte, 100<<10)), -1, 80<<10, 16<<10, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, &b); !errors.Is(err, ErrBodyTooLarge) || !errors.Is(b.Err(), ErrBodyTooLarge) {
		t.Fatalf("chunked past the limit while streamed: %v", err)
	}
	b.Release()
	if err := b.Fill(strings.NewReader("short"), 10, 1000, 64<<10, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a body shorter than its Content-Length: %v", err)
	}
	b.Release()
}
