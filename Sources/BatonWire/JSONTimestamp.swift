// Timestamps in MQTT and replay JSON: RFC 3339 UTC with microseconds, what Home Assistant's
// timestamp sensors and templates parse.

extension JSONWriter {
    /// Writes `us` (microseconds since the Unix epoch) as "YYYY-MM-DDTHH:MM:SS.ffffffZ".
    /// Years outside 0001–9999 cannot be written in RFC 3339 and come out as null.
    public mutating func timestamp(unixMicroseconds us: Int64) throws(WireError) {
        // 0001-01-01 and 10000-01-01 in seconds since the epoch.
        let seconds = us >= 0 ? us / 1_000_000 : (us + 1) / 1_000_000 - 1
        guard seconds >= -62_135_596_800, seconds < 253_402_300_800 else { return try null() }
        let micros = us - seconds * 1_000_000
        var text = RFC3339()
        text.format(seconds: seconds, micros: micros)
        try text.withBytes { b throws(WireError) in try string(utf8: b) }
    }
}
