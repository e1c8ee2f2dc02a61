// The sighting batch: docs/protocol.md §6. Vectors are the doc's, byte for byte.
import Testing
import BatonTestSupport
import BatonWire

/// The doc's vector (§6.3): run 1795430000123, counter 42, the badge heard at −61 dBm and the
/// named phone no longer heard.
private let twoRecords = hx("""
    01 fb a5 f7 07 a2 01 00 00 2a 00 00 00 00 00 00 00 02 00
    9a 78 56 34 12 5a c3
    2a 00 00 00 ff ff 7f
    """)

private func decode(_ bytes: [UInt8]) throws(WireError) -> (since: Int64, n: UInt64, records: [BatchedSighting], sightings: [Sighting]) {
    let result: Result<(Int64, UInt64, [BatchedSighting], [Sighting]), WireError> = bytes.withUnsafeBytes { raw in
        do throws(WireError) {
            let b = try SightingBatch.decode(raw)
            return .success((b.since, b.n, (0 ..< b.count).map { b[$0] }, (0 ..< b.count).map { b.sighting($0) }))
        } catch { return .failure(error) }
    }
    let v = try result.get()
    return (v.0, v.1, v.2, v.3)
}

private func refusal(_ bytes: [UInt8]) -> WireError? {
    do { _ = try decode(bytes); return nil } catch { return error }
}

/// Encodes into a buffer of `capacity` bytes.
private func encode(since: Int64, n: UInt64, _ records: [BatchedSighting], capacity: Int = 4096) throws(WireError) -> [UInt8] {
    var buf = [UInt8](repeating: 0xEE, count: capacity)
    let result: Result<[UInt8], WireError> = buf.withUnsafeMutableBytes { raw in
        do throws(WireError) {
            var w = try SightingBatchWriter(raw, since: since, n: n)
            for r in records { try w.append(device: r.device, rssi: r.rssi) }
            return .success(Array(w.finish()))
        } catch { return .failure(error) }
    }
    return try result.get()
}

@Suite("Sighting batch (docs/protocol.md §6)")
struct SightingBatchTests {
    // MARK: §6.3 vectors

    @Test func encodesTheDocumentedBytes() throws {
        let bytes = try encode(since: 1_795_430_000_123, n: 42, [
            BatchedSighting(device: 0x5a12_3456_789a, rssi: -61),
            BatchedSighting(device: 0xffff_0000_002a, rssi: nil),
        ])
        #expect(bytes == twoRecords)
        #expect(bytes.count == SightingBatch.encodedCount(records: 2))
    }

    @Test func decodesTheDocumentedBytesAsTheSightingsTheyStandFor() throws {
        let b = try decode(twoRecords)
        #expect(b.since == 1_795_430_000_123)
        #expect(b.n == 42)
        #expect(b.records == [BatchedSighting(device: 0x5a12_3456_789a, rssi: -61),
                              BatchedSighting(device: 0xffff_0000_002a, rssi: nil)])
        // Record i carries counter n + i: what two JSON sightings would have carried.
        #expect(b.sightings == [Sighting(rssi: -61, since: 1_795_430_000_123, n: 42),
                                Sighting(rssi: nil, since: 1_795_430_000_123, n: 43)])
    }

    @Test func theRSSIEdgesAndTheLargestCounterDecode() throws {
        // since 0, n 2⁶⁴ − 2, two records: the last carries 2⁶⁴ − 1, which does not wrap.
        let bytes = hx("""
            01 00 00 00 00 00 00 00 00 fe ff ff ff ff ff ff ff 02 00
            00 00 00 00 00 00 81
            ff ff ff ff ff ff 14
            """)
        let b = try decode(bytes)
        #expect(b.records == [BatchedSighting(device: 0, rssi: -127), BatchedSighting(device: 0xffff_ffff_ffff, rssi: 20)])
        #expect(b.sightings.last?.n == .max)
    }

    @Test func aFullBatchIs4096RecordsAndFitsMosquittosMessageLimit() throws {
        let records = (0 ..< SightingBatch.maxRecords).map { BatchedSighting(device: UInt64($0), rssi: -70) }
        let bytes = try encode(since: 1, n: 0, records, capacity: 65536)
        #expect(bytes.count == 28_691)
        #expect(Array(bytes[17 ..< 19]) == hx("00 10"))
        #expect(try decode(bytes).records.count == 4096)
    }

    // MARK: §6.4 refusals: the fixed part, then the tail, then the records

    @Test func anEmptyOrShortHeaderIsTruncated() {
        #expect(refusal([]) == .truncated(at: 0, need: 1))
        #expect(refusal(Array(twoRecords[..<1])) == .truncated(at: 1, need: 18))
        #expect(refusal(Array(twoRecords[..<18])) == .truncated(at: 1, need: 1))
    }

    @Test func anotherVersionIsUnsupported() {
        var bytes = twoRecords
        bytes[0] = 0x02
        #expect(refusal(bytes) == .unsupported(at: 0, value: 2))
        #expect(refusal(hx("7b")) == .unsupported(at: 0, value: 0x7b))  // `{`: a JSON sighting
    }

    @Test func aSinceAbove2To63IsRefused() {
        var bytes = twoRecords
        bytes[8] = 0x80
        #expect(refusal(bytes) == .malformed(at: 1, .batchSince))
    }

    @Test func aCountOfZeroOrAbove4096IsABadLength() {
        #expect(refusal(hx("01 fb a5 f7 07 a2 01 00 00 2a 00 00 00 00 00 00 00 00 00")) == .badLength(at: 17, length: 0))
        #expect(refusal(hx("01 fb a5 f7 07 a2 01 00 00 2a 00 00 00 00 00 00 00 01 10")) == .badLength(at: 17, length: 4097))
    }

    @Test func aCounterThatWouldWrapIsRefused() {
        // n = 2⁶⁴ − 1 with two records: the second would carry 2⁶⁴.
        #expect(refusal(hx("""
            01 00 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff 02 00
            00 00 00 00 00 00 81
            00 00 00 00 00 01 81
            """)) == .malformed(at: 9, .batchCounter))
    }

    @Test func theTailMustHoldExactlyCountRecords() {
        #expect(refusal(Array(twoRecords.dropLast())) == .truncated(at: 19, need: 1))
        #expect(refusal(Array(twoRecords[..<19])) == .truncated(at: 19, need: 14))
        #expect(refusal(twoRecords + [0x00]) == .trailing(at: 33, count: 1))
        // The fixed part is checked before the tail: a bad count with a short tail is the count.
        #expect(refusal(hx("01 fb a5 f7 07 a2 01 00 00 2a 00 00 00 00 00 00 00 00 00 9a")) == .badLength(at: 17, length: 0))
    }

    @Test func anRSSIOutsideTheControllersRangeIsNamedAtItsByte() {
        for bad: UInt8 in [0x80, 0x15, 0x7E] {
            var bytes = twoRecords
            bytes[32] = bad
            #expect(refusal(bytes) == .malformed(at: 32, .batchRSSI), "rssi byte \(bad)")
        }
        var bytes = twoRecords
        bytes[25] = 0x15  // +21 dBm in the first record
        #expect(refusal(bytes) == .malformed(at: 25, .batchRSSI))
    }

    // MARK: the writer

    @Test func theWriterNeedsRoomForTheHeaderAndOneRecord() {
        #expect(throws: WireError.noRoom(need: 26, have: 25)) { try encode(since: 1, n: 0, [], capacity: 25) }
    }

    @Test func aFullWriterSaysSoAndRefusesTheNextRecord() throws {
        var buf = [UInt8](repeating: 0, count: SightingBatch.encodedCount(records: 2) + 3)
        try buf.withUnsafeMutableBytes { raw throws in
            var w = try SightingBatchWriter(raw, since: 5, n: 7)
            try w.append(device: 1, rssi: -50)
            #expect(!w.isFull)
            try w.append(device: 2, rssi: nil)
            #expect(w.isFull)
            #expect(throws: WireError.noRoom(need: 40, have: 36)) { try w.append(device: 3, rssi: -40) }
            #expect(w.count == 2)
            #expect(Array(w.finish()) == hx("""
                01 05 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00 02 00
                01 00 00 00 00 00 ce
                02 00 00 00 00 00 7f
                """))
        }
    }

    @Test func aWriterWhoseNextCounterWouldWrapIsFull() throws {
        var buf = [UInt8](repeating: 0, count: 64)
        try buf.withUnsafeMutableBytes { raw throws in
            var w = try SightingBatchWriter(raw, since: 5, n: .max)
            try w.append(device: 1, rssi: -50)
            #expect(w.isFull)
        }
    }
}
