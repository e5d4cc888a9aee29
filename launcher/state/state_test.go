package state

import (
	"strings"
	"testing"
)

func TestStepIDNode(t *testing.T) {
	tests := []struct {
		in      string
		want    StepID
		wantErr string
	}{
		{in: "12.0.0", want: StepID{Job: 12}},
		{in: "12.3.1.n1", want: StepID{Job: 12, Step: 3, Restart: 1, Node: "n1"}},
		// Node names may hold dots: everything after the third dot.
		{in: "12.3.1.node-7.cluster", want: StepID{Job: 12, Step: 3, Restart: 1, Node: "node-7.cluster"}},
		{in: "12.3", wantErr: "want <job>.<step>.<restart>[.<node>]"},
		{in: "12.3.1.", wantErr: "want 1-64 bytes"},
		{in: "12.3.1.../x", wantErr: "is not allowed"},
		{in: "12.3.1.n 1", wantErr: "is not allowed"},
		{in: "12.3.1.-n1", wantErr: "is not allowed"},
		{in: "12.3.1." + strings.Repeat("a", 65), wantErr: "want 1-64 bytes"},
	}
	for _, tt := range tests {
		got, err := ParseStepID(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseStepID(%q) = %+v, %v; want error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseStepID(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			continue
		}
		if s := got.String(); s != tt.in {
			t.Errorf("String() = %q, want %q", s, tt.in)
		}
	}
}

func TestOfJobOnNode(t *testing.T) {
	tests := []struct {
		name string
		job  uint32
		node string
		want bool
	}{
		{"7.0.0.n1", 7, "n1", true},
		{"7.0.0.n2", 7, "n1", false},
		{"7.0.0", 7, "n1", false},
		{"7.0.0", 7, "", true},
		{"7.0.0.n1", 7, "", false},
		{"70.0.0.n1", 7, "n1", false},
		{"7.0.0.n1.x", 7, "n1", false},
		{"junk", 7, "", false},
	}
	for _, tt := range tests {
		if got := OfJobOnNode(tt.name, tt.job, tt.node); got != tt.want {
			t.Errorf("OfJobOnNode(%q, %d, %q) = %v, want %v", tt.name, tt.job, tt.node, got, tt.want)
		}
	}
}
