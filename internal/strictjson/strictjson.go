// Package strictjson reads a request body that must be exactly one JSON
// object, as strictly as keyway reads its configuration: nothing after the
// object (a second value, stray text), and no key twice in one object.
// encoding/json accepts both silently: it stops after the first value,
// and of a key given twice it keeps the last. The admin API decodes its
// JSON bodies here (PATCH of a set in package admin, a set definition in
// config.DecodeSet), so that no part of a request is dropped unseen.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// MaxDepth bounds how deeply objects and arrays may nest.
const MaxDepth = 100

// Check reports whether data is exactly one JSON object, surrounded by
// white space at most, with no key twice in any object. The error says
// what is wrong and where (a byte offset, and the key's path).
func Check(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return errors.New("the body is empty")
	case err != nil:
		return syntaxError(dec, err)
	case tok != json.Delim('{'):
		return fmt.Errorf("the body is %s, not a JSON object", describe(tok))
	}
	if err := object(dec, "", 1); err != nil {
		return err
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		rest := bytes.TrimLeft(data[end:], " \t\r\n")
		return fmt.Errorf("unexpected data after the JSON object, at byte %d: %s: send one object and nothing after it",
			int(end)+len(data[end:])-len(rest), quote(bytes.TrimSpace(rest)))
	}
	return nil
}

// Decode checks data (Check) and decodes it into v, refusing keys v has
// no field for.
func Decode(data []byte, v any) error {
	if err := Check(data); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describeDecodeError(err)
	}
	return nil
}

// object reads the rest of an object whose '{' was read; path is its
// place in the document ("" for the top level).
func object(dec *json.Decoder, path string, depth int) error {
	if depth > MaxDepth {
		return fmt.Errorf("at %s: objects and arrays nest deeper than %d levels", where(path), MaxDepth)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return syntaxError(dec, err)
		}
		key, ok := tok.(string)
		if !ok { // json.Decoder reports a non-string key as a syntax error; kept for safety
			return fmt.Errorf("at byte %d: an object key must be a string", dec.InputOffset())
		}
		p := join(path, key)
		if seen[key] {
			return fmt.Errorf("key %q is given twice: write each key once", p)
		}
		seen[key] = true
		if err := value(dec, p, depth); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return syntaxError(dec, err)
	}
	return nil
}

// value reads one value at path.
func value(dec *json.Decoder, path string, depth int) error {
	tok, err := dec.Token()
	if err != nil {
		return syntaxError(dec, err)
	}
	switch tok {
	case json.Delim('{'):
		return object(dec, path, depth+1)
	case json.Delim('['):
		if depth+1 > MaxDepth {
			return fmt.Errorf("at %s: objects and arrays nest deeper than %d levels", where(path), MaxDepth)
		}
		for i := 0; dec.More(); i++ {
			if err := value(dec, fmt.Sprintf("%s[%d]", path, i), depth+1); err != nil {
				return err
			}
		}
		if _, err := dec.Token(); err != nil { // the closing ']'
			return syntaxError(dec, err)
		}
	}
	return nil
}

// syntaxError says where the JSON stops being JSON.
func syntaxError(dec *json.Decoder, err error) error {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("invalid JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("the JSON ends early, at byte %d: an object or array is not closed", dec.InputOffset())
	}
	return fmt.Errorf("invalid JSON at byte %d: %v", dec.InputOffset(), err)
}

// describeDecodeError names the key of a decoding error.
func describeDecodeError(err error) error {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%s: want %s, got a JSON %s", cmpPath(te.Field), article(te.Type.String()), te.Value)
	}
	if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		return fmt.Errorf("unknown key %s", f)
	}
	return err
}

func cmpPath(field string) string {
	if field == "" {
		return "the body"
	}
	return field
}

func article(typ string) string {
	switch {
	case strings.HasPrefix(typ, "int"), strings.HasPrefix(typ, "uint"):
		return "an integer"
	case typ == "bool":
		return "true or false"
	case typ == "string":
		return "a string"
	}
	return "a " + typ
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func where(path string) string {
	if path == "" {
		return "the top level"
	}
	return path
}

func describe(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "an array"
		}
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "true or false"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", tok)
}

// quote shows at most 32 bytes of b.
func quote(b []byte) string {
	if len(b) > 32 {
		return fmt.Sprintf("%q…", b[:32])
	}
	return fmt.Sprintf("%q", b)
}
