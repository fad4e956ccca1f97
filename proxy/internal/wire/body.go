package wire

import (
	"errors"
	"io"
	"sync"
)

// Body is a request body as keyway forwards it: its first bytes buffered
// (all of it when it fits), the rest streamed from the client to the
// replica as the replica takes it. Nothing is sized by what the client
// announces: the buffer grows a chunk at a time as bytes arrive, each
// chunk taken from a Budget before it is allocated.
//
// A body is read by one goroutine at a time. The zero value is an empty
// body; Fill starts one, Release ends it.
type Body struct {
	chunks [MaxChunks]*[ChunkSize]byte
	nc     int   // chunks in use: chunks[:nc]
	n      int   // bytes buffered
	size   int64 // the body's length as framed (Content-Length), or -1 (chunked: until the stream ends)
	limit  int64 // most bytes the body may have (max_body_bytes)
	stream io.Reader
	budget Budget
	taken  int64 // bytes taken from budget
	// read state for the current attempt
	off      int   // next buffered byte to read
	streamed int64 // bytes read from stream since Fill's end (all attempts)
	whole    bool  // the stream ended within the buffer: the body is all buffered
	err      error // sticky stream error
}

const (
	// ChunkSize is the unit in which a body's buffer grows: a client that
	// stops sending holds at most one chunk more than it sent.
	ChunkSize = 4 << 10
	// MaxChunks bounds one body's buffer: MaxChunks*ChunkSize bytes
	// (1 MiB) are buffered at most; beyond, the body is streamed.
	MaxChunks = 256
	// MaxBuffered is the most bytes of a body buffered.
	MaxBuffered = MaxChunks * ChunkSize
)

// Budget is the global bound on buffered body bytes: Take adds n bytes
// and reports whether the sum stays within the bound; Give takes them
// back, whether Take said yes or no.
type Budget interface {
	Take(n int64) bool
	Give(n int64)
}

// ErrBudget says that the global body budget had no room for the next
// chunk of a body: nothing more was allocated.
var ErrBudget = errors.New("wire: the request bodies buffered would exceed the global budget")

// ErrBodyTooLarge says that a body went on past its limit.
var ErrBodyTooLarge = errors.New("wire: the request body exceeds its limit")

var chunkPool = sync.Pool{New: func() any { return new([ChunkSize]byte) }}

// Fill starts the body: it reads from stream until the body is whole, or
// max bytes (at most MaxBuffered) are buffered, and leaves the rest to be
// streamed. size is the body's framed length (-1: until the stream ends);
// limit is the most the body may have. Each chunk of the buffer is taken
// from budget (nil: no budget) before it is allocated. It returns
// ErrBudget, ErrBodyTooLarge or the stream's error; the body must be
// released in any case.
func (b *Body) Fill(stream io.Reader, size, limit int64, max int, budget Budget) error {
	// Field by field: the chunks' array is kept (and nothing in it).
	b.n, b.size, b.limit, b.stream, b.budget, b.taken = 0, size, limit, stream, budget, 0
	b.off, b.streamed, b.whole, b.err = 0, 0, false, nil
	if size > limit {
		b.err = ErrBodyTooLarge
		return b.err
	}
	max = min(max, MaxBuffered)
	if limit+1 < int64(max) {
		max = int(limit + 1) // one byte past the limit tells
	}
	if size >= 0 && size < int64(max) {
		max = int(size)
	}
	for b.n < max {
		c := b.n / ChunkSize
		if c == b.nc {
			if budget != nil {
				if !budget.Take(ChunkSize) {
					budget.Give(ChunkSize)
					return ErrBudget
				}
				b.taken += ChunkSize
			}
			b.chunks[c] = chunkPool.Get().(*[ChunkSize]byte)
			b.nc++
		}
		off := b.n % ChunkSize
		end := min(ChunkSize, off+(max-b.n))
		m, err := stream.Read(b.chunks[c][off:end])
		b.n += m
		if err == io.EOF {
			b.whole = true
			break
		}
		if err != nil {
			b.err = err
			return err
		}
	}
	if size >= 0 && int64(b.n) == size {
		b.whole = true
	}
	if size >= 0 && b.whole && int64(b.n) < size {
		b.err = io.ErrUnexpectedEOF
		return b.err
	}
	if b.whole {
		b.stream = nil
	}
	if int64(b.n) > limit {
		b.err = ErrBodyTooLarge
		return b.err
	}
	return nil
}

// Whole reports whether the body is all buffered: it can be sent again.
func (b *Body) Whole() bool { return b.whole }

// Len returns the bytes buffered.
func (b *Body) Len() int { return b.n }

// Size returns the body's framed length: Content-Length, or -1 for a body
// read until its stream ends (chunked).
func (b *Body) Size() int64 {
	if b.whole {
		return int64(b.n)
	}
	return b.size
}

// Bytes returns the body when it is whole within its first chunk, or
// nil: the caller may then set it as the request's body, as it is.
func (b *Body) Bytes() []byte {
	if !b.whole || b.n > ChunkSize {
		return nil
	}
	if b.n == 0 {
		return []byte{}
	}
	return b.chunks[0][:b.n]
}

// Rewind makes the body readable from its start again, for another
// attempt; false once a byte beyond the buffer was taken from the client:
// that byte is gone, and the body cannot be sent again.
func (b *Body) Rewind() bool {
	if b.streamed > 0 {
		return false
	}
	b.off = 0
	return true
}

// Streamed reports whether bytes beyond the buffer were taken from the
// client.
// A nil body has streamed nothing.
func (b *Body) Streamed() bool { return b != nil && b.streamed > 0 }

// BytesRead returns the bytes of the body taken from the client so far.
func (b *Body) BytesRead() int64 { return int64(b.n) + b.streamed }

// Err returns the error that ended the client's stream early: its
// reading failed (a reset, server.read_timeout), or the body went past
// its limit (ErrBodyTooLarge). A round trip that failed while the body
// has one failed because of the client, not the replica.
// A nil body has none.
func (b *Body) Err() error {
	if b == nil {
		return nil
	}
	return b.err
}

var bodies = sync.Pool{New: func() any { return new(Body) }}

// AcquireBody returns an empty body from a pool; ReleaseBody returns it.
func AcquireBody() *Body { return bodies.Get().(*Body) }

// ReleaseBody releases b (Release) and returns it to the pool.
func ReleaseBody(b *Body) {
	b.Release()
	bodies.Put(b)
}

// Read reads the body: its buffered bytes, then the client's stream.
func (b *Body) Read(p []byte) (int, error) {
	if b.off < b.n {
		c, off := b.off/ChunkSize, b.off%ChunkSize
		end := min(ChunkSize, off+(b.n-b.off))
		m := copy(p, b.chunks[c][off:end])
		b.off += m
		return m, nil
	}
	if b.stream == nil {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	m, err := b.stream.Read(p)
	b.streamed += int64(m)
	if int64(b.n)+b.streamed > b.limit {
		b.err = ErrBodyTooLarge
		return m, b.err
	}
	if err != nil && err != io.EOF {
		b.err = err
	}
	return m, err
}

// Release gives the buffer back to the pool and the budget.
func (b *Body) Release() {
	for i := range b.nc {
		chunkPool.Put(b.chunks[i])
		b.chunks[i] = nil
	}
	if b.budget != nil && b.taken > 0 {
		b.budget.Give(b.taken)
	}
	b.nc, b.n, b.stream, b.budget, b.taken, b.err = 0, 0, nil, nil, 0, nil
	b.off, b.streamed, b.whole = 0, 0, false
}
