package api

// Bytes converts a string list (argv, KEY=VALUE environment) to the bytes
// fields of the API, byte for byte: Go strings hold any bytes, protobuf
// strings only UTF-8.
func Bytes(ss []string) [][]byte {
	if ss == nil {
		return nil
	}
	out := make([][]byte, len(ss))
	for i, s := range ss {
		out[i] = []byte(s)
	}
	return out
}

// Strings is the inverse of Bytes.
func Strings(bs [][]byte) []string {
	if bs == nil {
		return nil
	}
	out := make([]string, len(bs))
	for i, b := range bs {
		out[i] = string(b)
	}
	return out
}
