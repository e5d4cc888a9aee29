package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
)

// Option is one entry of args.c's mv_spank_options table.
type Option struct {
	Name    string // without the leading "--"
	ArgInfo string // accepted forms of the value; "" for a flag
	Usage   string // the help text, "[microvm] " heading removed
	HasArg  int    // spank_option has_arg: 0 none, 1 required, 2 optional
}

var (
	tableRE = regexp.MustCompile(`(?s)static struct spank_option mv_spank_options\[\] = \{(.*?)SPANK_OPTIONS_TABLE_END`)
	entryRE = regexp.MustCompile(`(?s)\{\s*"([a-z-]+)",\s*(NULL|"(?:[^"\\]|\\.)*"),\s*((?:"(?:[^"\\]|\\.)*"\s*)+),\s*([0-9]+),\s*(MV_OPT_[A-Z_]+),\s*[a-z_]+\s*\}`)
	strRE   = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
	enumRE  = regexp.MustCompile(`(?s)enum \{\s*(MV_OPT_[A-Z_]+\s*=\s*1,.*?)\};`)
	valRE   = regexp.MustCompile(`MV_OPT_[A-Z_]+`)
)

// Parse reads the option table out of args.c's source. Errors: no table,
// an entry it cannot read, or an MV_OPT_ value of the enum without an
// entry (or an entry whose value the enum lacks): the page would miss or
// invent an option.
func Parse(src []byte) ([]Option, error) {
	m := tableRE.FindSubmatch(src)
	if m == nil {
		return nil, fmt.Errorf("args.c: no mv_spank_options table ending in SPANK_OPTIONS_TABLE_END")
	}
	table := m[1]
	var opts []Option
	seen := map[string]bool{}
	for _, e := range entryRE.FindAllSubmatch(table, -1) {
		o := Option{Name: string(e[1])}
		if string(e[2]) != "NULL" {
			o.ArgInfo = unquote(string(e[2]))
		}
		var usage strings.Builder
		for _, s := range strRE.FindAllSubmatch(e[3], -1) {
			usage.WriteString(unquote(`"` + string(s[1]) + `"`))
		}
		o.Usage = strings.TrimSpace(strings.TrimPrefix(usage.String(), "[microvm]"))
		o.HasArg, _ = strconv.Atoi(string(e[4]))
		seen[string(e[5])] = true
		opts = append(opts, o)
	}
	if n := bytes.Count(table, []byte("MV_OPT_")); n != len(opts) {
		return nil, fmt.Errorf("args.c: mv_spank_options has %d MV_OPT_ entries, %d of them readable: update spank/manpage's parser to the table's form", n, len(opts))
	}
	em := enumRE.FindSubmatch(src)
	if em == nil {
		return nil, fmt.Errorf("args.c: no enum of MV_OPT_ values (MV_OPT_... = 1, ...)")
	}
	for _, v := range valRE.FindAll(em[1], -1) {
		if !seen[string(v)] {
			return nil, fmt.Errorf("args.c: enum value %s has no entry in mv_spank_options", v)
		}
		delete(seen, string(v))
	}
	for v := range seen {
		return nil, fmt.Errorf("args.c: mv_spank_options entry %s is not in the MV_OPT_ enum", v)
	}
	return opts, nil
}

func unquote(s string) string {
	u, err := strconv.Unquote(s)
	if err != nil {
		return strings.Trim(s, `"`)
	}
	return u
}

// roff escapes text for a troff body line.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// Render is the troff source of spank-microvm(8).
func Render(opts []Option) []byte {
	var b bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	p(`.TH SPANK\-MICROVM 8 "" "slurm-microvm" "Slurm plugins"`)
	p(`.SH NAME`)
	p(`spank\-microvm \- run Slurm job steps inside microVMs (SPANK plugin spank_microvm.so)`)
	p(`.SH SYNOPSIS`)
	var syn []string
	for _, o := range opts {
		if o.ArgInfo != "" {
			syn = append(syn, fmt.Sprintf(`[\fB\-\-%s\fR=\fI%s\fR]`, roff(o.Name), roff(o.ArgInfo)))
		} else {
			syn = append(syn, fmt.Sprintf(`[\fB\-\-%s\fR]`, roff(o.Name)))
		}
	}
	p(`\fBsrun\fR %s \fIcommand\fR ...`, strings.Join(syn, " "))
	p(`.PP`)
	p(`The same options are taken by \fBsbatch\fR(1) and \fBsalloc\fR(1).`)
	p(`.SH DESCRIPTION`)
	p(`The plugin adds the options below to srun, sbatch and salloc (listed under the`)
	p(`[microvm] heading of \fBsrun \-\-help\fR). With \fB\-\-microvm\fR, each task of the`)
	p(`step runs inside a microVM booted from the image, one VM per step per node,`)
	p(`started by \fBslurm\-microvm\fR(1). Values are checked by`)
	p(`\fBslurm\-microvm validate\fR as the submitting user before the job is queued.`)
	p(`Giving an option twice with different values, or a \fB\-\-microvm\-*\fR option`)
	p(`without \fB\-\-microvm\fR, is refused.`)
	p(`.SH OPTIONS`)
	for _, o := range opts {
		p(`.TP`)
		if o.ArgInfo != "" {
			p(`\fB\-\-%s\fR=\fI%s\fR`, roff(o.Name), roff(o.ArgInfo))
		} else {
			p(`\fB\-\-%s\fR`, roff(o.Name))
		}
		p(`%s`, roff(o.Usage))
	}
	p(`.SH PLUGSTACK.CONF`)
	p(`One line in \fBplugstack.conf\fR(5) enables the plugin on a node (the Debian package`)
	p(`prints it when installed and never edits plugstack.conf itself):`)
	p(`.PP`)
	p(`.EX`)
	p(`required /usr/lib/x86_64\-linux\-gnu/slurm\-wlm/spank_microvm.so launcher=/usr/bin/slurm\-microvm config=/etc/slurm/microvm.toml`)
	p(`.EE`)
	p(`.PP`)
	p(`Arguments (all optional, paths absolute; any other is refused by name):`)
	p(`.TP`)
	p(`\fBlauncher=\fIPATH\fR`)
	p(`the launcher, \fBslurm\-microvm\fR(1) (default /usr/local/bin/slurm\-microvm, where make install puts it)`)
	p(`.TP`)
	p(`\fBexec=\fIPATH\fR`)
	p(`the tasks' exec entry (default \fIlauncher\fR\-exec)`)
	p(`.TP`)
	p(`\fBconfig=\fIPATH\fR`)
	p(`passed to the launcher as \-\-config (default /etc/slurm/microvm.toml)`)
	p(`.TP`)
	p(`\fBtimeout=\fISECS\fR`)
	p(`bound of every synchronous launcher call (default 300)`)
	p(`.SH FILES`)
	p(`.TP`)
	p(`/etc/slurm/microvm.toml`)
	p(`node configuration; check it with \fBslurm\-microvm config check\fR`)
	p(`.SH SEE ALSO`)
	p(`\fBslurm\-microvm\fR(1), \fBsrun\fR(1), \fBspank\fR(7), \fBplugstack.conf\fR(5)`)
	return b.Bytes()
}

func main() {
	args := flag.String("args", "spank/args.c", "the plugin's args.c")
	out := flag.String("o", "spank-microvm.8", "page to write")
	flag.Parse()
	src, err := os.ReadFile(*args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manpage:", err)
		os.Exit(1)
	}
	opts, err := Parse(src)
	if err != nil {
		fmt.Fprintln(os.Stderr, "manpage:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, Render(opts), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "manpage:", err)
		os.Exit(1)
	}
}
