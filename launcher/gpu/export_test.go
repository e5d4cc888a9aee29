package gpu

// SetSysfsWriter makes p write sysfs attributes through w (a fake kernel
// in tests) instead of the files themselves.
func SetSysfsWriter(p *Plan, w func(path, value string) error) { p.write = w }
