package fs

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	ro := func(s, d string) Mount { return Mount{Source: s, Destination: d, ReadOnly: true} }
	for _, tc := range []struct {
		name, in string
		want     []Mount
	}{
		{"empty", "", nil},
		{"one", "/a:/b", []Mount{ro("/a", "/b")}},
		{"same path", "/lustre/data", []Mount{ro("/lustre/data", "/lustre/data")}},
		{"rw", "/a:/b:rw", []Mount{{Source: "/a", Destination: "/b"}}},
		{"ro explicit", "/a:/b:ro", []Mount{ro("/a", "/b")}},
		{"optional", "/a:/b:optional", []Mount{{Source: "/a", Destination: "/b", ReadOnly: true, Optional: true}}},
		{"rw optional", "/a:/b:rw+optional", []Mount{{Source: "/a", Destination: "/b", Optional: true}}},
		{"repeated flag", "/a:/b:ro+ro", []Mount{ro("/a", "/b")}},
		{"two", "/a:/b,/c:/d:rw", []Mount{ro("/a", "/b"), {Source: "/c", Destination: "/d"}}},
		{"destination cleaned", "/a:/b/../c//d/", []Mount{ro("/a", "/c/d")}},
		{"source kept as written", "/a/../b/:/c", []Mount{ro("/a/../b/", "/c")}},
		{"escaped comma", `/my\,data:/data`, []Mount{ro("/my,data", "/data")}},
		{"escaped colon", `/x\:y:/d\:e`, []Mount{ro("/x:y", "/d:e")}},
		{"escaped backslash", `/back\\slash:/d`, []Mount{ro(`/back\slash`, "/d")}},
		{"space", "/with space/x:/in guest", []Mount{ro("/with space/x", "/in guest")}},
		{"option text in a path", `/data\,readonly=off:/d`, []Mount{ro("/data,readonly=off", "/d")}},
		{"dollar is literal", "/x$HOME:/d", []Mount{ro("/x$HOME", "/d")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(OptionName, tc.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.in, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Parse(%q) = %+v, want %+v", tc.in, got, tc.want)
			}
			// Round trip: Parse(Format(m)) == m, and Format is canonical.
			f := Format(got)
			again, err := Parse(OptionName, f)
			if err != nil || !reflect.DeepEqual(again, got) {
				t.Fatalf("Parse(Format(%+v) = %q) = %+v, %v", got, f, again, err)
			}
			if f2 := Format(again); f2 != f {
				t.Errorf("Format not stable: %q then %q", f, f2)
			}
		})
	}
}

func TestFormatCanonicalRoundTrip(t *testing.T) {
	for _, in := range []string{
		"/a:/b:ro",
		"/a:/b:rw,/c:/d:ro+optional",
		`/my\,data:/d\:x:rw`,
		`/a\\b:/with space:ro`,
	} {
		ms, err := Parse(OptionName, in)
		if err != nil {
			t.Fatal(err)
		}
		if got := Format(ms); got != in {
			t.Errorf("Format(Parse(%q)) = %q", in, got)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		entry    int
		msg      string // substring of the message
	}{
		{"relative destination", "/a:/b,/c:data", 2, `destination "data" must be absolute`},
		{"relative source", "a:/b", 1, `source "a" must be an absolute path`},
		{"space after comma", "/a:/b, /c:/d", 2, "spaces are part of the path"},
		{"root destination", "/a:/", 1, "guest's root directory"},
		{"destination normalising to root", "/x:/y,/a:/b/..", 2, "guest's root directory"},
		{"empty source", ":/b", 1, "empty source"},
		{"empty destination", "/a:", 1, "empty destination"},
		{"empty flags", "/a:/b:", 1, "empty flags"},
		{"unknown flag", "/a:/b,/c:/d:rx", 2, `unknown flag "rx"`},
		{"nosuid is not a flag", "/a:/b:ro+nosuid", 1, `unknown flag "nosuid"`},
		{"ro and rw", "/a:/b:ro+rw", 1, "both ro and rw"},
		{"too many colons", "/a:/b:ro:x", 1, "too many ':'"},
		{"unescaped colon in path", "/x:y:/d:ro", 1, "too many ':'"},
		{"option text split", "/data,readonly=off:/d", 2, `source "readonly=off" must be an absolute path`},
		{"empty entry", "/a:/b,,/c:/d", 2, "empty entry"},
		{"trailing comma", "/a:/b,", 2, "empty entry"},
		{"newline", "/a:/b,/c\n:/d", 2, "newline"},
		{"NUL", "/a\x00:/b", 1, "NUL"},
		{"unknown escape", `/a:/b,/c\x:/d`, 2, `unknown escape "\x"`},
		{"trailing backslash", `/a:/b\`, 1, `trailing '\'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(OptionName, tc.in)
			var se *SpecError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) = %v, want a *SpecError", tc.in, err)
			}
			if se.Entry != tc.entry || !strings.Contains(se.Msg, tc.msg) {
				t.Errorf("Parse(%q): entry %d, %q; want entry %d, %q", tc.in, se.Entry, se.Msg, tc.entry, tc.msg)
			}
			if !strings.HasPrefix(err.Error(), OptionName+": ") {
				t.Errorf("error %q does not start with the option name", err)
			}
		})
	}
	// The exact text the design asks for.
	_, err := Parse(OptionName, "/a:/b,/c:data")
	if want := `--microvm-mounts: destination "data" must be absolute (entry 2 of "/a:/b,/c:data")`; err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
	_, err = Parse(EnvVar, "/c:data")
	if err == nil || !strings.HasPrefix(err.Error(), EnvVar+": ") {
		t.Errorf("environment fallback error %v does not name %s", err, EnvVar)
	}
}

func TestParseWorkdir(t *testing.T) {
	for in, want := range map[string]string{"": "", "/": "/", "/work/../data/": "/data", "/a b": "/a b"} {
		if got, err := ParseWorkdir(in); err != nil || got != want {
			t.Errorf("ParseWorkdir(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"data", "./x", "/a\nb", "/a\x00"} {
		if _, err := ParseWorkdir(in); err == nil || !strings.HasPrefix(err.Error(), WorkdirOption) {
			t.Errorf("ParseWorkdir(%q): %v", in, err)
		}
	}
}
