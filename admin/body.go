package admin

import (
	"bytes"
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
	_, err := decodeOptionalBody(r, limit, v, false)
	return err
}

// decodeOptionalBody is decodeBody for a body that may be left out:
// with optional, no body (or only white space) leaves v as it is and
// present false.
func decodeOptionalBody(r *http.Request, limit int64, v any, optional bool) (present bool, err error) {
	b, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return false, fmt.Errorf("reading it: %w", err)
	}
	if int64(len(b)) > limit {
		return false, fmt.Errorf("longer than %d bytes", limit)
	}
	if optional && len(bytes.TrimSpace(b)) == 0 {
		return false, nil
	}
	return true, strictjson.Decode(b, v)
}
