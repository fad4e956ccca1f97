// Package tlsconfig builds keyway's TLS configurations from its
// configuration keys: the server side (the proxy listener and the admin
// listener: certificates chosen by SNI, a minimum version, optional client
// certificate verification, certificates re-read when their files change)
// and the client side (a replica set's connections to its replicas: a CA
// file, a client certificate, a server name per replica). It imports
// nothing of keyway's.
package tlsconfig
