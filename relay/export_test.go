package relay

// StreamKey lets tests take a stream's lock the way a relay does.
var StreamKey = streamKey
