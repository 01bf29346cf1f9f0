package progress

import (
	"strings"
	"testing"
	"time"
)

func TestLine(t *testing.T) {
	t.Parallel()
	t.Run("a known total shows a bar, percent, rate and eta", func(t *testing.T) {
		l := line("scan", 50, 100, 10, 5*time.Second)
		for _, want := range []string{"[###############...............]", "50/100", "50.0%", "10/s", "eta 5s"} {
			if !strings.Contains(l, want) {
				t.Errorf("%q lacks %q", l, want)
			}
		}
	})
	t.Run("an unknown total shows the count", func(t *testing.T) {
		if l := line("scan", 7, 0, 1, time.Second); !strings.Contains(l, "7 done") {
			t.Errorf("%q", l)
		}
	})
	t.Run("a non-terminal writer is not a terminal", func(t *testing.T) {
		if isTerminal(&strings.Builder{}) {
			t.Error("a builder is a terminal?")
		}
	})
}
