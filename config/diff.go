package config

import (
	"reflect"
	"strconv"
)

// Change is one key whose value differs between two configurations.
type Change struct {
	// Path is the key's YAML path: "server.read_timeout",
	// "replica_sets[1].timeouts.request", "gossip.join" (a list of
	// scalars is one value).
	Path string
	// Old and New are the values as they would be written in the file.
	Old, New string
}

// Diff lists the keys whose values differ from a to b, in file order. A
// list of structs is compared element by element ("replica_sets[2].name");
// an element only one side has is reported whole at its index, with the
// missing side written "(none)".
func Diff(a, b Config) []Change {
	var out []Change
	diffValue(reflect.ValueOf(a), reflect.ValueOf(b), "", &out)
	return out
}

func diffValue(a, b reflect.Value, path string, out *[]Change) {
	t := a.Type()
	switch {
	case isScalar(t) || (t.Kind() == reflect.Slice && isScalar(t.Elem())):
		// An empty list and an absent one are the same value: a file
		// written by yaml.v3 has "join: []" where the defaults have none.
		emptyLists := t.Kind() == reflect.Slice && a.Len() == 0 && b.Len() == 0
		if !emptyLists && !reflect.DeepEqual(a.Interface(), b.Interface()) {
			*out = append(*out, Change{Path: path, Old: formatValue(a), New: formatValue(b)})
		}
	case t.Kind() == reflect.Struct:
		for _, f := range fieldsOf(t) {
			diffValue(a.FieldByIndex(f.index), b.FieldByIndex(f.index), joinKey(path, f.name), out)
		}
	case t.Kind() == reflect.Slice:
		for i := range max(a.Len(), b.Len()) {
			p := path + "[" + strconv.Itoa(i) + "]"
			switch {
			case i >= a.Len():
				*out = append(*out, Change{Path: p, Old: "(none)", New: "(added)"})
			case i >= b.Len():
				*out = append(*out, Change{Path: p, Old: "(present)", New: "(none)"})
			default:
				diffValue(a.Index(i), b.Index(i), p, out)
			}
		}
	case !reflect.DeepEqual(a.Interface(), b.Interface()):
		*out = append(*out, Change{Path: path, Old: "(changed)", New: "(changed)"})
	}
}
