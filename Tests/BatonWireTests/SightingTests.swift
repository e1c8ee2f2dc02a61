// The sighting message: docs/rooms.md §2. Messages are written as the JSON on the wire.
import Testing
import BatonWire

/// Decodes `text`'s UTF-8 bytes.
private func decode(_ text: String) throws(WireError) -> Sighting {
    try decode(Array(text.utf8))
}

private func decode(_ bytes: [UInt8]) throws(WireError) -> Sighting {
    let result: Result<Sighting, WireError> = bytes.withUnsafeBytes { raw in
        do throws(WireError) { return .success(try Sighting.decode(raw)) } catch { return .failure(error) }
    }
    return try result.get()
}

/// The error `text` is refused with, or nil when it decodes.
private func refusal(_ text: String) -> WireError? {
    do { _ = try decode(text); return nil } catch { return error }
}

/// Encodes into a buffer of `capacity` bytes.
private func encode(_ s: Sighting, capacity: Int = Sighting.maxEncodedCount) throws(WireError) -> String {
    var buf = [UInt8](repeating: 0, count: capacity)
    let result: Result<String, WireError> = buf.withUnsafeMutableBytes { raw in
        var w = JSONWriter(raw)
        do throws(WireError) {
            try s.write(into: &w)
            return .success(String(decoding: w.written, as: UTF8.self))
        } catch {
            return .failure(error)
        }
    }
    return try result.get()
}

private let heard = Sighting(rssi: -61, since: 1_795_430_000_123, n: 42)

@Suite("Sighting (docs/rooms.md §2)")
struct SightingTests {
    // MARK: the format

    @Test func encodesTheDocumentedBytes() throws {
        #expect(try encode(heard) == #"{"rssi":-61,"since":1795430000123,"n":42}"#)
        #expect(try encode(Sighting(rssi: nil, since: 1_795_430_000_123, n: 43))
                == #"{"rssi":null,"since":1795430000123,"n":43}"#)
        #expect(try encode(Sighting(rssi: 20, since: 0, n: 0)) == #"{"rssi":20,"since":0,"n":0}"#)
    }

    @Test func decodesTheDocumentedBytes() throws {
        #expect(try decode(#"{"rssi":-61,"since":1795430000123,"n":42}"#) == heard)
        #expect(try decode(#"{"rssi":null,"since":1795430000123,"n":43}"#)
                == Sighting(rssi: nil, since: 1_795_430_000_123, n: 43))
    }

    @Test func theLargestSightingFitsMaxEncodedCount() throws {
        let largest = Sighting(rssi: -127, since: .max, n: .max)
        let text = try encode(largest)
        #expect(text == #"{"rssi":-127,"since":9223372036854775807,"n":18446744073709551615}"#)
        #expect(text.utf8.count == Sighting.maxEncodedCount)
        #expect(try decode(text) == largest)
    }

    @Test func aBufferTooSmallIsNoRoom() {
        #expect(throws: WireError.self) { try encode(heard, capacity: 20) }
    }

    @Test func roundTrips() throws {
        for rssi: Int8? in [nil, -127, -100, -61, -1, 0, 1, 20] {
            for since: Int64 in [0, 1, 1_795_430_000_123, .max] {
                for n: UInt64 in [0, 1, 42, UInt64(Int64.max) + 1, .max] {
                    let s = Sighting(rssi: rssi, since: since, n: n)
                    #expect(try decode(encode(s)) == s)
                }
            }
        }
    }

    // MARK: what a tolerant reader accepts

    @Test func whitespaceAndKeyOrderDoNotMatter() throws {
        let text = " \t\r\n{ \"n\" :\n42 , \"since\":1795430000123,\"rssi\"\t:\t-61 }\n\n"
        #expect(try decode(text) == heard)
    }

    @Test func unknownKeysWithScalarValuesAreSkipped() throws {
        // A later version may add fields (docs/rooms.md §2 "Decoding"); this one reads past them.
        let text = #"{"v":2,"rssi":-61,"q":-1.5e+3,"room":"K\u00fcche \"2\" \\ \/ \n","since":1795430000123,"#
            + #""ok":true,"no":false,"x":null,"big":123456789012345678901234567890,"name":"Küche 🏠","n":42}"#
        #expect(try decode(text) == heard)
    }

    @Test func minusZeroRSSIIsZero() throws {
        #expect(try decode(#"{"rssi":-0,"since":1,"n":1}"#).rssi == 0)
    }

    // MARK: every rule, by name

    @Test func rssiOutsideWhatAControllerReportsIsAbsurd() {
        // Core 5.4, Vol 4, Part E, §7.7.65.2: −127…+20 dBm. Its own reason on the stats topic.
        for bad in ["21", "-128", "127", "1000", "-99999999999999999999999"] {
            let e = refusal(#"{"rssi":\#(bad),"since":1,"n":1}"#)
            #expect(e == .malformed(at: 8, .sightingRSSI), "rssi \(bad)")
        }
        #expect(refusal(#"{"rssi":20,"since":1,"n":1}"#) == nil)
        #expect(refusal(#"{"rssi":-127,"since":1,"n":1}"#) == nil)
    }

    @Test func eachKeyIsRequiredOnce() {
        #expect(refusal(#"{"rssi":-61,"since":1}"#) == .malformed(at: 21, .sightingMissingKey))
        #expect(refusal(#"{"since":1,"n":1}"#) == .malformed(at: 16, .sightingMissingKey))
        #expect(refusal(#"{"rssi":-61,"n":1}"#) == .malformed(at: 17, .sightingMissingKey))
        #expect(refusal("{}") == .malformed(at: 1, .sightingMissingKey))
        #expect(refusal(#"{"rssi":-61,"since":1,"n":1,"rssi":-60}"#) == .malformed(at: 28, .sightingDuplicateKey))
        #expect(refusal(#"{"since":1,"rssi":null,"n":1,"since":2}"#) == .malformed(at: 29, .sightingDuplicateKey))
        #expect(refusal(#"{"n":1,"n":1,"rssi":-61,"since":1}"#) == .malformed(at: 7, .sightingDuplicateKey))
    }

    @Test func keysAreComparedAsTheyStand() {
        // An escaped key could otherwise stand beside its plain twin as a second `rssi`.
        #expect(refusal(#"{"rs\u0073i":-61,"since":1,"n":1}"#) == .malformed(at: 4, .sightingKeyEscape))
        #expect(refusal(#"{"RSSI":-61,"since":1,"n":1}"#) == .malformed(at: 27, .sightingMissingKey))
    }

    @Test func containersAreRefused() {
        #expect(refusal(#"{"rssi":-61,"since":1,"n":1,"x":{}}"#) == .malformed(at: 32, .sightingNested))
        #expect(refusal(#"{"rssi":-61,"since":1,"n":1,"x":[1]}"#) == .malformed(at: 32, .sightingNested))
        #expect(refusal(#"{"rssi":[-61],"since":1,"n":1}"#) == .malformed(at: 8, .sightingNested))
        #expect(refusal(#"[{"rssi":-61,"since":1,"n":1}]"#) == .malformed(at: 0, .sightingSyntax))
    }

    @Test func knownKeysNeedTheirKindOfValue() {
        #expect(refusal(#"{"rssi":"-61","since":1,"n":1}"#) == .malformed(at: 8, .sightingType))
        #expect(refusal(#"{"rssi":true,"since":1,"n":1}"#) == .malformed(at: 8, .sightingType))
        #expect(refusal(#"{"rssi":-61,"since":null,"n":1}"#) == .malformed(at: 20, .sightingType))
        #expect(refusal(#"{"rssi":-61,"since":1,"n":false}"#) == .malformed(at: 26, .sightingType))
    }

    @Test func numbersMustBeIntegers() {
        #expect(refusal(#"{"rssi":-61.5,"since":1,"n":1}"#) == .malformed(at: 8, .sightingNotInteger))
        #expect(refusal(#"{"rssi":-61,"since":1.0,"n":1}"#) == .malformed(at: 20, .sightingNotInteger))
        #expect(refusal(#"{"rssi":-61,"since":1,"n":1e2}"#) == .malformed(at: 26, .sightingNotInteger))
    }

    @Test func sinceAndCounterStayInTheirRanges() {
        #expect(refusal(#"{"rssi":-61,"since":9223372036854775808,"n":1}"#) == .malformed(at: 20, .sightingSince))
        #expect(refusal(#"{"rssi":-61,"since":-1,"n":1}"#) == .malformed(at: 20, .sightingSince))
        #expect(refusal(#"{"rssi":-61,"since":1,"n":18446744073709551616}"#) == .malformed(at: 26, .sightingCounter))
        #expect(refusal(#"{"rssi":-61,"since":1,"n":-1}"#) == .malformed(at: 26, .sightingCounter))
        #expect(refusal(#"{"rssi":-61,"since":1,"n":99999999999999999999999999}"#) == .malformed(at: 26, .sightingCounter))
    }

    @Test func jsonSyntaxIsStrict() {
        let cases: [(String, Int)] = [
            (#"{"rssi":061,"since":1,"n":1}"#, 9),       // leading zero (RFC 8259 §6)
            (#"{"rssi":+61,"since":1,"n":1}"#, 8),       // no plus sign
            (#"{"rssi":-,"since":1,"n":1}"#, 9),         // a sign without digits
            (#"{"rssi" -61,"since":1,"n":1}"#, 8),       // no colon
            (#"{"rssi":-61 "since":1,"n":1}"#, 12),      // no comma
            (#"{"rssi":-61,"since":1,"n":1,}"#, 28),     // trailing comma
            (#"{rssi:-61,"since":1,"n":1}"#, 1),         // unquoted key
            (#"{"rssi":nul,"since":1,"n":1}"#, 11),      // misspelt literal
            (#"{"rssi":-61,"since":1,"n":1,"x":tru}"#, 35),
            (#"{"rssi":-61,"since":1,"n":1,"x":"\q"}"#, 34), // an escape outside the grammar
            (#"{"rssi":-61,"since":1,"n":1,"x":"\u12G4"}"#, 37),
            ("{\"rssi\":-61,\"since\":1,\"n\":1,\"x\":\"a\u{1}\"}", 34), // a raw control character
            (#"{"rssi":-61,"since":1,"n":1,"x":1.}"#, 34),
            (#"{"rssi":-61,"since":1,"n":1,"x":1e}"#, 34),
            (#"{"rssi":-61,"since":1,"n":1,"x":'a'}"#, 32),
        ]
        for (text, at) in cases {
            #expect(refusal(text) == .malformed(at: at, .sightingSyntax), "\(text)")
        }
    }

    @Test func stringsMustBeUTF8() {
        var bytes = Array(#"{"rssi":-61,"since":1,"n":1,"x":"ab"}"#.utf8)
        bytes[33] = 0xC3; bytes[34] = 0x28  // a lead byte followed by a non-continuation
        #expect(throws: WireError.malformed(at: 33, .sightingUTF8)) { try decode(bytes) }
        bytes[33] = 0xFF
        #expect(throws: WireError.malformed(at: 33, .sightingUTF8)) { try decode(bytes) }
    }

    @Test func onlyWhitespaceMayFollow() {
        #expect(refusal(#"{"rssi":-61,"since":1,"n":1} x"#) == .trailing(at: 29, count: 1), "whitespace skipped, then the x")
        #expect(refusal(#"{"rssi":-61,"since":1,"n":1}{}"#) == .trailing(at: 28, count: 2))
        #expect(refusal("{\"rssi\":-61,\"since\":1,\"n\":1}\0") == .trailing(at: 28, count: 1))
        #expect(refusal("{\"rssi\":-61,\"since\":1,\"n\":1} \n\t\r") == nil)
    }

    @Test func everyTruncationOfValidInputIsTruncatedAndNeverTraps() {
        // Each cut before the closing brace ends the input mid-document: `truncated` at the end.
        let messages = [
            #"{"rssi":-61,"since":1795430000123,"n":42}"#,
            #"{"rssi":null,"since":0,"n":18446744073709551615}"#,
            #" { "n" : 1 , "x" : "K\u00fc \"é🏠\"" , "y" : -1.5e-3 , "z" : true , "rssi" : -127 , "since" : 5 } "#,
        ]
        for text in messages {
            let bytes = Array(text.utf8)
            let close = bytes.lastIndex(of: UInt8(ascii: "}"))!
            for cut in 0 ... close {
                let e: WireError?
                do { _ = try decode(Array(bytes[..<cut])); e = nil } catch { e = error }
                guard case .truncated(let at, let need)? = e else {
                    Issue.record("\(cut)-byte prefix of \(text): \(String(describing: e))")
                    continue
                }
                #expect(at == cut && need >= 1)
            }
            #expect(refusal(text) == nil)
        }
    }

    @Test func emptyInputIsTruncated() {
        #expect(refusal("") == .truncated(at: 0, need: 1))
        #expect(refusal("  ") == .truncated(at: 2, need: 1))
    }

    @Test func reasonNamesAreTheStatsKeys() {
        // The gateway counts drops under these names (docs/rooms.md §5).
        let names = [Malformed.sightingSyntax, .sightingNested, .sightingDuplicateKey, .sightingMissingKey,
                     .sightingKeyEscape, .sightingType, .sightingNotInteger, .sightingRSSI, .sightingSince,
                     .sightingCounter, .sightingUTF8].map(\.description)
        #expect(names == ["sighting-syntax", "sighting-nested", "sighting-duplicate-key", "sighting-missing-key",
                          "sighting-key-escape", "sighting-type", "sighting-not-integer", "sighting-rssi",
                          "sighting-since", "sighting-n", "sighting-utf8"])
    }
}
