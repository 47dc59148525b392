package suggest

import "testing"

func TestClosest(t *testing.T) {
	keys := []string{"name", "scope", "limit", "window", "shadow", "data-dir", "max_memory"}
	for in, want := range map[string]string{
		"limt": "limit", "limits": "limit", "widnow": "window", "NAME": "name", "shdw": "", "per": "", "": "", "scopes": "scope", "x": "",
		"data_dir": "data-dir", "datadir": "data-dir", "max-memory": "max_memory", "MAX_MEMORY": "max_memory",
	} {
		if got := Closest(in, keys); got != want {
			t.Errorf("Closest(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"", "abc", 3}, {"kitten", "sitting", 3}, {"limit", "limt", 1}, {"abc", "abc", 0}, {"ab", "ba", 2}} {
		if got := editDistance(c.a, c.b); got != c.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", c.a, c.b, got, c.d)
		}
	}
}
