package gpu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/slurm-microvm/slurm-microvm/launcher/hostlist"
)

// DefaultGresConf is where slurmd reads gres.conf on Debian's packages.
const DefaultGresConf = "/etc/slurm/gres.conf"

// GresConf is the gpu part of gres.conf for one node.
type GresConf struct {
	// Path is the file read.
	Path string `json:"path"`
	// Node is the Slurm node name NodeName= lines were matched against.
	Node string `json:"node"`
	// AutoDetect is the AutoDetect= value in effect for this node ("" when
	// none; a NodeName= line's value overrides a global one). The mapping
	// ignores it: see Notes.
	AutoDetect string `json:"autodetect,omitempty"`
	// Devices are the node's gpu device files in Slurm's index order.
	Devices []GresDevice `json:"devices"`
	// Notes are things an admin should know (unknown keys, AutoDetect).
	Notes []string `json:"notes,omitempty"`
}

// GresDevice is one GPU as gres.conf lists it.
type GresDevice struct {
	// Index is Slurm's global index: the position of the device among
	// this node's Name=gpu device files, in file order. This is what
	// SLURM_STEP_GPUS holds (measured on Slurm 22.05: with File=/dev/x3
	// listed before File=/dev/x[0-1], a 1-GPU step gets SLURM_STEP_GPUS=0
	// and may open only /dev/x3).
	Index int `json:"index"`
	// File is the device file that stands for the GPU.
	File string `json:"file"`
	// Files are all files of a MultipleFiles= entry (else just File).
	Files []string `json:"files,omitempty"`
	// Type is the Type= value ("" when none).
	Type string `json:"type,omitempty"`
	// Source and Line locate the entry (Source differs from
	// GresConf.Path for an Include'd file).
	Source string `json:"source"`
	Line   int    `json:"line"`
	// Entry is the logical line as written (continuations joined).
	Entry string `json:"entry"`
}

// Where is "path:line" of the entry.
func (d GresDevice) Where() string { return fmt.Sprintf("%s:%d", d.Source, d.Line) }

// LoadGresConf reads and parses path for node (see ParseGresConf). A
// missing file is an error wrapping both ErrGresConf and os.ErrNotExist.
func LoadGresConf(path, node string) (*GresConf, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrGresConf, path, err)
	}
	return parseGresConf(path, data, node, os.ReadFile)
}

// ParseGresConf parses gres.conf text per gres.conf(5) and keeps the
// Name=gpu entries that apply to node: lines without NodeName= and lines
// whose NodeName= hostlist names it. Keys are case-insensitive; "#" starts
// a comment ("\#" is a literal #); a line ending in "\" continues on the
// next; File=, MultipleFiles= and NodeName= take hostlist expressions
// (/dev/nvidia[0-3], /dev/nvidia[0,2-3]). Include lines are not followed
// (use LoadGresConf). Errors wrap ErrGresConf and name the line.
func ParseGresConf(path string, data []byte, node string) (*GresConf, error) {
	return parseGresConf(path, data, node, nil)
}

type readFunc func(string) ([]byte, error)

func parseGresConf(path string, data []byte, node string, read readFunc) (*GresConf, error) {
	c := &GresConf{Path: path, Node: node}
	var globalAuto, nodeAuto string
	if err := c.parseInto(path, data, read, 0, &globalAuto, &nodeAuto); err != nil {
		return nil, err
	}
	c.AutoDetect = globalAuto
	if nodeAuto != "" {
		c.AutoDetect = nodeAuto
	}
	if a := strings.ToLower(c.AutoDetect); a != "" && a != "off" {
		c.Notes = append(c.Notes, fmt.Sprintf("AutoDetect=%s is ignored here: GPUs map by the File= lines in file order, which is Slurm's order only without autodetection; set AutoDetect=off and list every GPU with File= (see etc/gres.conf)", c.AutoDetect))
	}
	return c, nil
}

func (c *GresConf) parseInto(path string, data []byte, read readFunc, depth int, globalAuto, nodeAuto *string) error {
	if depth > 8 {
		return fmt.Errorf("%w: %s: Include nested more than 8 deep", ErrGresConf, path)
	}
	for _, ll := range logicalLines(string(data)) {
		bad := func(format string, a ...any) error {
			return fmt.Errorf("%w: %s:%d: %s", ErrGresConf, path, ll.line, fmt.Sprintf(format, a...))
		}
		fields, err := splitFields(ll.text)
		if err != nil {
			return bad("%v", err)
		}
		if len(fields) == 0 {
			continue
		}
		if strings.EqualFold(fields[0], "include") {
			if len(fields) != 2 {
				return bad("Include takes one file name")
			}
			if read == nil {
				c.Notes = append(c.Notes, fmt.Sprintf("%s:%d: Include %s not followed", path, ll.line, fields[1]))
				continue
			}
			inc := fields[1]
			if !filepath.IsAbs(inc) {
				inc = filepath.Join(filepath.Dir(path), inc)
			}
			b, err := read(inc)
			if err != nil {
				return bad("Include: %v", err)
			}
			if err := c.parseInto(inc, b, read, depth+1, globalAuto, nodeAuto); err != nil {
				return err
			}
			continue
		}
		kv := map[string]string{}
		for _, f := range fields {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return bad("%q is not Key=Value", f)
			}
			k = strings.ToLower(k)
			if _, dup := kv[k]; dup {
				return bad("%s= given twice", k)
			}
			kv[k] = unquote(v)
		}
		applies := true
		if nn, ok := kv["nodename"]; ok {
			names, err := hostlist.Expand(nn)
			if err != nil {
				return bad("NodeName: %v", err)
			}
			applies = false
			for _, n := range names {
				if n == c.Node {
					applies = true
				}
			}
		}
		if ad, ok := kv["autodetect"]; ok && applies {
			if _, hasNode := kv["nodename"]; hasNode {
				*nodeAuto = ad
			} else {
				*globalAuto = ad
			}
		}
		for k := range kv {
			switch k {
			case "autodetect", "count", "cores", "cpus", "file", "flags", "links", "multiplefiles", "name", "nodename", "type":
			default:
				c.Notes = append(c.Notes, fmt.Sprintf("%s:%d: unknown key %s ignored", path, ll.line, k))
			}
		}
		if !applies || !strings.EqualFold(kv["name"], "gpu") {
			continue
		}
		if err := c.addGPULine(path, ll, kv, bad); err != nil {
			return err
		}
	}
	return nil
}

func (c *GresConf) addGPULine(path string, ll logicalLine, kv map[string]string, bad func(string, ...any) error) error {
	file, hasFile := kv["file"]
	multi, hasMulti := kv["multiplefiles"]
	if hasFile && hasMulti {
		return bad("File= and MultipleFiles= are exclusive")
	}
	if !hasFile && !hasMulti {
		return bad("Name=gpu without File=: Slurm sets no device files for these GPUs, so a step's GPUs cannot be mapped to PCI devices; list them with File= (see etc/gres.conf)")
	}
	entry := strings.Join(strings.Fields(ll.text), " ")
	dev := GresDevice{Type: kv["type"], Source: path, Line: ll.line, Entry: entry}
	if hasMulti {
		files, err := hostlist.Expand(multi)
		if err != nil {
			return bad("MultipleFiles: %v", err)
		}
		if cnt, ok := kv["count"]; ok && cnt != "1" {
			return bad("MultipleFiles= is one GPU: Count=%s must be 1", cnt)
		}
		dev.Index = len(c.Devices)
		dev.Files = files
		dev.File = files[0]
		for _, f := range files {
			if _, ok := nvidiaMinorFromName(f); ok || isVFIOGroupFile(f) {
				dev.File = f
				break
			}
		}
		c.Devices = append(c.Devices, dev)
		return nil
	}
	files, err := hostlist.Expand(file)
	if err != nil {
		return bad("File: %v", err)
	}
	if cnt, ok := kv["count"]; ok {
		n, err := strconv.Atoi(cnt)
		if err != nil || n != len(files) {
			return bad("Count=%s does not match the %d file(s) of File=%s", cnt, len(files), file)
		}
	}
	for _, f := range files {
		for _, d := range c.Devices {
			if d.File == f {
				return bad("device file %s already listed at line %d", f, d.Line)
			}
		}
		d := dev
		d.Index = len(c.Devices)
		d.File = f
		c.Devices = append(c.Devices, d)
	}
	return nil
}

// Device returns the device with Slurm index i.
func (c *GresConf) Device(i int) (GresDevice, bool) {
	if i < 0 || i >= len(c.Devices) {
		return GresDevice{}, false
	}
	return c.Devices[i], true
}

type logicalLine struct {
	line int // first physical line, 1-based
	text string
}

// logicalLines strips comments and joins continued lines.
func logicalLines(s string) []logicalLine {
	var out []logicalLine
	var cur strings.Builder
	start := 0
	for i, raw := range strings.Split(s, "\n") {
		line := stripComment(strings.TrimRight(raw, "\r"))
		if cur.Len() == 0 {
			start = i + 1
		}
		t := strings.TrimRight(line, " \t")
		if strings.HasSuffix(t, `\`) {
			cur.WriteString(strings.TrimSuffix(t, `\`))
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(line)
		out = append(out, logicalLine{line: start, text: cur.String()})
		cur.Reset()
	}
	if cur.Len() > 0 {
		out = append(out, logicalLine{line: start, text: cur.String()})
	}
	return out
}

// stripComment cuts at the first unescaped '#'; "\#" becomes '#'.
func stripComment(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && s[i+1] == '#' {
			b.WriteByte('#')
			i++
			continue
		}
		if s[i] == '#' {
			break
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// splitFields splits on blanks outside double quotes.
func splitFields(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	inQuote := false
	for _, r := range s {
		switch {
		case r == '"':
			inQuote = !inQuote
			cur.WriteRune(r)
		case (r == ' ' || r == '\t') && !inQuote:
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if inQuote {
		return nil, errors.New("unterminated quote")
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out, nil
}

func unquote(v string) string {
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		return v[1 : len(v)-1]
	}
	return v
}

// nvidiaMinorFromName parses /dev/nvidia<N> (not nvidiactl, nvidia-uvm,
// nvidia-caps/...).
func nvidiaMinorFromName(f string) (int, bool) {
	rest, ok := strings.CutPrefix(f, "/dev/nvidia")
	if !ok || rest == "" {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return 0, false
	}
	return n, true
}

// vfioGroupFromName parses /dev/vfio/<group>.
func vfioGroupFromName(f string) (int, bool) {
	rest, ok := strings.CutPrefix(f, "/dev/vfio/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || strconv.Itoa(n) != rest {
		return 0, false
	}
	return n, true
}

func isVFIOGroupFile(f string) bool { _, ok := vfioGroupFromName(f); return ok }
