package fleetauth

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"go.yaml.in/yaml/v3"
)

// The credentials file: YAML, written by keyway keys, read by proxies and
// agents (gossip.credentials_file). Every file lists every public key; a
// private key list is only in the file of the role that signs with it.
//
//	proxy:
//	  public: [ed25519-pub:…]
//	  private: [ed25519-seed:…]   # proxies' file only
//	agents:
//	  orders:
//	    public: [ed25519-pub:…]
//	    private: [ed25519-seed:…] # orders' agents' file only

type fileList struct {
	Public  []string `yaml:"public"`
	Private []string `yaml:"private,omitempty"`
}

type file struct {
	Proxy  fileList            `yaml:"proxy"`
	Agents map[string]fileList `yaml:"agents,omitempty"`
}

// Parse reads a credentials file's contents. Each error names the field
// (proxy.public[0], agents.orders.private[1], …).
func Parse(b []byte) (Credentials, error) {
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return Credentials{}, fmt.Errorf("not a keyway credentials file: %w (make one with: keyway keys)", err)
	}
	var errs []error
	list := func(field string, l fileList) KeyList {
		var out KeyList
		for i, s := range l.Public {
			pub, err := ParsePublic(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.public[%d]: %w", field, i, err))
				continue
			}
			out.Public = append(out.Public, pub)
		}
		for i, s := range l.Private {
			priv, err := ParsePrivate(s)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.private[%d]: %w", field, i, err))
				continue
			}
			out.Private = append(out.Private, priv)
		}
		return out
	}
	c := Credentials{Proxy: list("proxy", f.Proxy), Agents: map[string]KeyList{}}
	for _, set := range slices.Sorted(maps.Keys(f.Agents)) {
		c.Agents[set] = list("agents."+set, f.Agents[set])
	}
	return c, errors.Join(errs...)
}

// Load reads and parses a credentials file.
func Load(path string) (Credentials, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Credentials{}, err
	}
	c, err := Parse(b)
	if err != nil {
		return Credentials{}, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Marshal writes credentials in the file's form, with a header comment.
func (c Credentials) Marshal(header string) []byte {
	list := func(l KeyList) fileList {
		var out fileList
		for _, pub := range l.Public {
			out.Public = append(out.Public, FormatPublic(pub))
		}
		for _, priv := range l.Private {
			out.Private = append(out.Private, FormatPrivate(priv))
		}
		return out
	}
	f := file{Proxy: list(c.Proxy)}
	if len(c.Agents) > 0 {
		f.Agents = map[string]fileList{}
		for set, l := range c.Agents {
			f.Agents[set] = list(l)
		}
	}
	var buf bytes.Buffer
	for _, l := range bytes.Split([]byte(header), []byte("\n")) {
		if len(l) > 0 {
			buf.WriteString("# ")
			buf.Write(l)
		} else {
			buf.WriteString("#")
		}
		buf.WriteByte('\n')
	}
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(f); err != nil {
		// Strings and maps of strings always encode.
		panic("fleetauth: " + err.Error())
	}
	_ = enc.Close()
	return buf.Bytes()
}

// Public returns the credentials without private keys.
func (c Credentials) Public() Credentials {
	out := Credentials{Proxy: KeyList{Public: slices.Clone(c.Proxy.Public)}, Agents: map[string]KeyList{}}
	for set, l := range c.Agents {
		out.Agents[set] = KeyList{Public: slices.Clone(l.Public)}
	}
	return out
}

// ForProxy returns what a proxy holds: every public key and the proxy's
// private keys. ForAgent returns what set's agents hold: every public key
// and their set's private keys.
func (c Credentials) ForProxy() Credentials {
	out := c.Public()
	out.Proxy.Private = slices.Clone(c.Proxy.Private)
	return out
}

func (c Credentials) ForAgent(set string) Credentials {
	out := c.Public()
	l := out.Agents[set]
	l.Private = slices.Clone(c.Agents[set].Private)
	out.Agents[set] = l
	return out
}

// Generate returns new credentials: one proxy key and one agent key per
// set, private halves included.
func Generate(sets []string) Credentials {
	c := Credentials{Agents: map[string]KeyList{}}
	pub, priv := NewKey()
	c.Proxy = KeyList{Public: []ed25519.PublicKey{pub}, Private: []ed25519.PrivateKey{priv}}
	for _, set := range sets {
		pub, priv := NewKey()
		c.Agents[set] = KeyList{Public: []ed25519.PublicKey{pub}, Private: []ed25519.PrivateKey{priv}}
	}
	return c
}
