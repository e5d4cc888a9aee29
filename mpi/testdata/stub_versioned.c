/* stub_versioned: a library whose version script (passed at build time)
 * defines a symbol version no real build has, standing in for an image
 * copy of a library newer than the host's (libfabric's FABRIC_x.y,
 * zlib's ZLIB_x.y). */
int stub_versioned_marker(void) { return 0; }
