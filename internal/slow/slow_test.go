package slow

import "testing"

func TestEnabled(t *testing.T) {
	for v, want := range map[string]bool{"": false, "0": false, "1": true, "true": true, "yes": false} {
		t.Setenv(Env, v)
		if got := Enabled(); got != want {
			t.Errorf("%s=%q: Enabled() = %v, want %v", Env, v, got, want)
		}
	}
	t.Setenv(Env, "")
	ran := false
	t.Run("skipped", func(t *testing.T) {
		Skip(t)
		ran = true
	})
	if ran {
		t.Error("Skip did not skip with the variable unset")
	}
}
