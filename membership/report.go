package membership

import (
	"encoding/json"
	"errors"
)

// DrainReport is the user message a proxy sends, a few times a second, to
// the agent of every replica it sees draining: how many of its requests
// are still in flight to that replica. An agent considers its replica
// drained once every live proxy has reported DrainingSeen with Inflight 0
// after the drain began.
type DrainReport struct {
	// Kind is always "drain_report"; other kinds are ignored.
	Kind    string `json:"kind"`
	Set     string `json:"set"`
	Replica string `json:"replica"`
	// Boot identifies the replica incarnation the report is about.
	Boot int64 `json:"boot"`
	// DrainingSeen says the proxy routes with the replica out of rotation
	// because it is draining: it sends no new requests.
	DrainingSeen bool `json:"draining_seen"`
	// Inflight is the number of the proxy's requests to the replica that
	// have not finished.
	Inflight int64 `json:"inflight"`
	// StoppedSeen says the proxy sees the replica advertising stopped (with
	// its remove flag, if set): an agent leaving for good waits for it, so
	// that no proxy takes its leave for a crash.
	StoppedSeen bool `json:"stopped_seen,omitempty"`
}

// DrainReportKind is the kind of a DrainReport message.
const DrainReportKind = "drain_report"

const drainReportKind = DrainReportKind

// Encode returns the message bytes.
func (r DrainReport) Encode() []byte {
	r.Kind = drainReportKind
	b, _ := json.Marshal(r)
	return b
}

// ErrNotDrainReport is returned for a message of another kind.
var ErrNotDrainReport = errors.New("membership: not a drain report")

// DecodeDrainReport parses a message written by Encode.
func DecodeDrainReport(b []byte) (DrainReport, error) {
	var r DrainReport
	if err := json.Unmarshal(b, &r); err != nil {
		return r, err
	}
	if r.Kind != drainReportKind {
		return r, ErrNotDrainReport
	}
	return r, nil
}
