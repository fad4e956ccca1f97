package admin

import (
	"fmt"
	"io"
	"net/http"

	"keyway/internal/strictjson"
)

// decodeBody reads a JSON request body of at most limit bytes into v as
// strictly as a set definition is read (config.DecodeSet): one object,
// nothing after it, no key twice, no key v does not have. encoding/json
// alone would apply {"replicas":5} of `{"replicas":5}{"stop":true}` and
// drop the rest unseen.
func decodeBody(r *http.Request, limit int64, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return fmt.Errorf("reading it: %w", err)
	}
	if int64(len(b)) > limit {
		return fmt.Errorf("longer than %d bytes", limit)
	}
	return strictjson.Decode(b, v)
}
