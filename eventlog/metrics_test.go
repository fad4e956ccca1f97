package eventlog

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"keyway/internal/metricstest"
)

func TestMetrics(t *testing.T) {
	cfg := fileConfig(t)
	cfg.Buffer = 1
	l, reg := newLog(t, cfg, Options{})
	// Run is not running: the first event is queued, the others dropped.
	l.Emit(Event{Kind: KindProbeDown})
	l.Emit(Event{Kind: KindEjected})
	l.Emit(Event{Kind: KindEjected})
	l.Emit(Event{Kind: "bad\xffkind"}) // not a label value: not counted by kind

	want := `
# HELP keyway_audit_dropped_total Audit events kept in memory but not written to a file, by reason (queue_full, write_error).
# TYPE keyway_audit_dropped_total counter
keyway_audit_dropped_total{reason="queue_full"} 3
keyway_audit_dropped_total{reason="write_error"} 0
# HELP keyway_audit_events_total Audit events emitted, by kind (whether or not they reached a file).
# TYPE keyway_audit_events_total counter
keyway_audit_events_total{kind="ejected"} 2
keyway_audit_events_total{kind="probe_down"} 1
# HELP keyway_audit_file_rotations_total Audit files closed because the next line would have taken them past max_file_bytes.
# TYPE keyway_audit_file_rotations_total counter
keyway_audit_file_rotations_total 0
# HELP keyway_audit_write_errors_total Failed file operations of the audit trail (mkdir, list, create, write, close, sync, remove).
# TYPE keyway_audit_write_errors_total counter
keyway_audit_write_errors_total 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	metricstest.Lint(t, reg)
}
