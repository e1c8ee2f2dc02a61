// Who published a retained activity or Apple entry (docs/mqtt.md §2, §3), read for the orphan
// scan (docs/mqtt.md §5) and the owner's corrections (docs/rooms.md §7). Messages as on the wire.
import Testing
import BatonWire

private func gateway(_ text: String) -> String? {
    Array(text.utf8).withUnsafeBytes { RetainedEntry.gateway($0) }
}

@Suite("The gateway of a retained entry (docs/mqtt.md §2, §3)") struct RetainedEntryTests {
    /// docs/mqtt.md §2's example, byte for byte.
    @Test func theDocumentedMessageNamesItsGateway() {
        let message = #"{"device":"5a123456789a","state":"current","change":"saved","seq":259,"#
            + #""type_hash":"be9b4bb7","group":"a1b2c3d4","supports_streams":true,"has_web_url":true,"#
            + #""relayed":false,"psm":128,"verified":false,"room":"Hall","gateway":"hall","rssi":-61,"#
            + #""first_seen":"2026-11-23T09:14:03.512204Z","changed":"2026-11-23T09:20:41.004318Z"}"#
        #expect(gateway(message) == "hall")
    }

    /// docs/mqtt.md §3: an Apple entry carries `kinds`, an array of strings.
    @Test func anAppleEntryNamesItsGateway() {
        let entry = #"{"id":"1a2b3c4d","resolved":false,"kinds":["handoff","nearby-info"],"handoff_seq":17564,"#
            + #""handoff_changed":"2026-11-23T09:20:41.004318Z","rssi":-70,"addresses":1,"room":"Hall","#
            + #""gateway":"hall","first_seen":"2026-11-23T09:14:03.512204Z"}"#
        #expect(gateway(entry) == "hall")
        #expect(gateway(#"{"kinds":[],"gateway":"k"}"#) == "k")
        #expect(gateway(#"{"kinds":[ 1 , true, null ,"x" ],"gateway":"k"}"#) == "k")
    }

    @Test func keysInAnyOrderWhitespaceAndEscapesElsewhereAreFine() {
        #expect(gateway(" {\n\t\"gateway\" : \"living-room_2\" , \"room\":\"Caf\\u00e9 \\\"A\\\"\", \"rssi\":null}\r\n") == "living-room_2")
        #expect(gateway(#"{"rssi":-61.5e0,"gateway":"k","x":true,"y":false}"#) == "k")
    }

    @Test func whatNamesNoGateway() {
        #expect(gateway("") == nil)                                              // empty: a clear
        #expect(gateway("{}") == nil)                                            // no gateway
        #expect(gateway(#"{"gateway":7}"#) == nil)                               // not a string
        #expect(gateway(#"{"gateway":"a","gateway":"b"}"#) == nil)               // twice: whose?
        #expect(gateway(#"{"gateway":"h\u0061ll"}"#) == nil)                     // an escape no gateway writes
        #expect(gateway(#"{"gateway":"hall","room":{"x":1}}"#) == nil)           // nested: not ours
        #expect(gateway(#"{"gateway":"hall","list":[[1]]}"#) == nil)            // an array in an array
        #expect(gateway(#"{"gateway":["hall"]}"#) == nil)                        // not a string
        #expect(gateway(#"{"gateway":"hall","kinds":["handoff",}"#) == nil)      // a cut array
        #expect(gateway(#"{"gateway":"hall""#) == nil)                           // truncated
        #expect(gateway(#"{"gateway":"hall"} x"#) == nil)                        // trailing bytes
        #expect(gateway(#"{"gateway":"hall",}"#) == nil)                         // a trailing comma
        #expect(gateway(#"["gateway","hall"]"#) == nil)                          // not an object
        #expect(gateway(#"{"gateway":"hall","ok":tru}"#) == nil)                 // a misspelt literal
        #expect(Array<UInt8>([0x7B, 0x22, 0x67, 0x22, 0x3A, 0x22, 0xFF, 0x22, 0x7D]).withUnsafeBytes {
            RetainedEntry.gateway($0)
        } == nil)                                                                // {"g":"\xFF"}: not UTF-8
    }
}
