// The fetch request body: docs/relay.md §2. Bodies are written as the JSON on the wire; offsets
// in errors count bytes from its start.
import Testing
import BatonWire

private func decode(_ bytes: [UInt8]) -> Result<FetchRequest, WireError> {
    bytes.withUnsafeBytes { raw in
        do throws(WireError) { return .success(try FetchRequest.decode(raw)) } catch { return .failure(error) }
    }
}

private func decode(_ text: String) throws(WireError) -> FetchRequest { try decode(Array(text.utf8)).get() }

/// The error `text` is refused with, or nil when it decodes.
private func refusal(_ text: String) -> WireError? { refusal(Array(text.utf8)) }

private func refusal(_ bytes: [UInt8]) -> WireError? {
    if case .failure(let e) = decode(bytes) { return e }
    return nil
}

/// The text `range` of `text` covers.
private func string(_ range: Range<Int>?, of text: String) -> String? {
    guard let range else { return nil }
    return String(decoding: Array(text.utf8)[range], as: UTF8.self)
}

private func correlationBytes(_ hex: String) -> [UInt8] {
    var out = [UInt8](repeating: 0xEE, count: FetchRequest.maxCorrelation)
    let n = Array(hex.utf8).withUnsafeBytes { h in
        out.withUnsafeMutableBytes { o in FetchRequest.correlationBytes(h, into: o) }
    }
    #expect(out[n...].allSatisfy { $0 == 0xEE }, "wrote past what it returned")
    return Array(out[..<n])
}

@Suite("Fetch request body (docs/relay.md §2)")
struct FetchRequestTests {
    // MARK: defaults

    @Test func anEmptyBodyAsksWithEveryDefault() throws {
        #expect(try decode("") == FetchRequest(format: .cbor, responseTopic: nil, correlationHex: nil))
        #expect(try decode(" \t\r\n ") == FetchRequest())
        #expect(try decode("{}") == FetchRequest())
        #expect(try decode(" { \n } \n") == FetchRequest())
    }

    // MARK: each key

    @Test func formatIsCborOrJson() throws {
        #expect(try decode(#"{"format":"json"}"#).format == .json)
        #expect(try decode(#"{"format":"cbor"}"#).format == .cbor)
    }

    @Test func responseTopicIsARangeOfTheBody() throws {
        let text = #"{"response_topic":"kitchen/tv/answer"}"#
        let r = try decode(text)
        #expect(r.responseTopic == 19 ..< 36)
        #expect(string(r.responseTopic, of: text) == "kitchen/tv/answer")
        #expect(r.format == .cbor && r.correlationHex == nil)
    }

    @Test func correlationIsARangeOfHexDigits() throws {
        let text = #"{"correlation":"0a1B2c3D"}"#
        let r = try decode(text)
        #expect(string(r.correlationHex, of: text) == "0a1B2c3D")
        #expect(r.format == .cbor && r.responseTopic == nil)
    }

    @Test func continueSaysWhereTheActivityIsContinued() throws {
        let text = #"{"continue":"Living room TV"}"#
        let r = try decode(text)
        #expect(r.continuedAt == 13 ..< 27)
        #expect(string(r.continuedAt, of: text) == "Living room TV")
        #expect(try decode("{}").continuedAt == nil, "absent: the fetch only looks")
        // 1…64 bytes of UTF-8: the device's `continued` message carries it (protocol.md §5.1).
        let sixtyFour = String(repeating: "é", count: 32)
        #expect(string(try decode(#"{"continue":"\#(sixtyFour)"}"#).continuedAt, of: #"{"continue":"\#(sixtyFour)"}"#) == sixtyFour)
        #expect(refusal(#"{"continue":"\#(sixtyFour)a"}"#) == .malformed(at: 13 + 64, .fetchContinue))
        #expect(refusal(#"{"continue":""}"#) == .malformed(at: 12, .fetchContinue))
        #expect(refusal([UInt8](#"{"continue":""#.utf8) + [0xC3, 0x28] + [UInt8](#""}"#.utf8)) == .malformed(at: 13, .fetchContinue))
        #expect(refusal(#"{"continue":"a","continue":"b"}"#) == .malformed(at: 16, .fetchDuplicateKey))
        #expect(refusal(#"{"continue":1}"#) == .malformed(at: 12, .fetchType))
    }

    @Test func allThreeInAnyOrderWithWhitespace() throws {
        let text = "\n{ \"correlation\" : \"00FF\" ,\t\"format\":\"json\",\r\n\"response_topic\": \"büro/tv\" }\n"
        let r = try decode(text)
        #expect(r.format == .json)
        #expect(string(r.responseTopic, of: text) == "büro/tv")
        #expect(string(r.correlationHex, of: text) == "00FF")
    }

    // MARK: response_topic (1–256 bytes of UTF-8, no + # NUL)

    @Test func aResponseTopicIs1To256Bytes() throws {
        let t256 = String(repeating: "t", count: 256)
        let text = #"{"response_topic":"\#(t256)"}"#
        #expect(try decode(text).responseTopic?.count == FetchRequest.maxResponseTopic)
        // The 257th byte of the topic is byte 19 + 256 of the body.
        #expect(refusal(#"{"response_topic":"\#(t256)t"}"#) == .malformed(at: 275, .fetchResponseTopic))
        #expect(refusal(#"{"response_topic":""}"#) == .malformed(at: 18, .fetchResponseTopic))
        #expect(try decode(#"{"response_topic":"a"}"#).responseTopic == 19 ..< 20)
    }

    @Test func aResponseTopicHasNoWildcards() {
        // MQTT 5.0 §4.7.1: + and # are for filters; a client cannot publish to them.
        #expect(refusal(#"{"response_topic":"home/+/answer"}"#) == .malformed(at: 24, .fetchResponseTopic))
        #expect(refusal(##"{"response_topic":"home/#"}"##) == .malformed(at: 24, .fetchResponseTopic))
        #expect(refusal(##"{"response_topic":"#"}"##) == .malformed(at: 19, .fetchResponseTopic))
    }

    @Test func aResponseTopicIsUTF8() {
        var bytes = Array(#"{"response_topic":"ab"}"#.utf8)
        bytes[20] = 0xFF
        #expect(refusal(bytes) == .malformed(at: 20, .fetchResponseTopic))
        bytes[19] = 0xED; bytes[20] = 0xA0  // a surrogate's first two bytes, then the quote
        #expect(refusal(bytes) == .malformed(at: 19, .fetchResponseTopic))
    }

    @Test func onlyASequenceMoreBytesCouldCompleteIsTruncated() {
        // "€" is E2 82 AC: cut after E2 82 the body could still go on, so it is truncated.
        let euro = Array(#"{"response_topic":"€"#.utf8)
        #expect(refusal(Array(euro.dropLast())) == .truncated(at: euro.count - 1, need: 1))
        #expect(refusal(Array(euro.dropLast(2))) == .truncated(at: euro.count - 2, need: 2))
        // No bytes after FF, or after E2 41, can make UTF-8 of them: refused where they stand,
        // even at the very end.
        #expect(refusal(Array(#"{"response_topic":"a"#.utf8) + [0xFF]) == .malformed(at: 20, .fetchResponseTopic))
        #expect(refusal(Array(#"{"response_topic":"a"#.utf8) + [0xE2, 0x41]) == .malformed(at: 20, .fetchResponseTopic))
    }

    @Test func aNULCannotBeWrittenInAResponseTopic() {
        // Raw it is a control character (RFC 8259 §7), escaped it is an escape (§2 allows none).
        #expect(refusal("{\"response_topic\":\"a\u{0}b\"}") == .malformed(at: 20, .fetchSyntax))
        #expect(refusal(#"{"response_topic":"a\u0000b"}"#) == .malformed(at: 20, .fetchSyntax))
    }

    // MARK: correlation (an even number of hex digits, at most 128)

    @Test func aCorrelationIs2To128HexDigitsOfEitherCase() throws {
        let d128 = String(repeating: "aB", count: 64)
        let r = try decode(#"{"correlation":"\#(d128)"}"#)
        #expect(r.correlationHex == 16 ..< 144)
        // The 129th digit is byte 16 + 128.
        #expect(refusal(#"{"correlation":"\#(d128)00"}"#) == .malformed(at: 144, .fetchCorrelation))
        #expect(refusal(#"{"correlation":"\#(d128)0"}"#) == .malformed(at: 144, .fetchCorrelation))
        #expect(try decode(#"{"correlation":"00"}"#).correlationHex == 16 ..< 18)
    }

    @Test func anOddCountOfDigitsIsRefusedAtTheDigitWithoutAPair() {
        #expect(refusal(#"{"correlation":"abc"}"#) == .malformed(at: 18, .fetchCorrelation))
        #expect(refusal(#"{"correlation":"0"}"#) == .malformed(at: 16, .fetchCorrelation))
    }

    @Test func anEmptyCorrelationIsRefused() {
        // An even number of digits, but no Correlation Data to echo: a client that wants none
        // leaves the key out.
        #expect(refusal(#"{"correlation":""}"#) == .malformed(at: 15, .fetchCorrelation))
    }

    @Test func aCorrelationHoldsOnlyHexDigits() {
        #expect(refusal(#"{"correlation":"0g"}"#) == .malformed(at: 17, .fetchCorrelation))
        #expect(refusal(#"{"correlation":"0x12"}"#) == .malformed(at: 17, .fetchCorrelation))
        #expect(refusal(#"{"correlation":"12 34"}"#) == .malformed(at: 18, .fetchCorrelation))
        #expect(refusal(#"{"correlation":"éé"}"#) == .malformed(at: 16, .fetchCorrelation))
    }

    @Test func correlationBytesAreTheDigitsPairByPair() {
        #expect(correlationBytes("0a1B2c3D") == [0x0A, 0x1B, 0x2C, 0x3D])
        #expect(correlationBytes("00ff") == [0x00, 0xFF])
        #expect(correlationBytes("") == [])
        let d128 = String(repeating: "Fe", count: 64)
        #expect(correlationBytes(d128) == [UInt8](repeating: 0xFE, count: 64))
        #expect(correlationBytes("0123456789abcdefABCDEF") == [0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF, 0xAB, 0xCD, 0xEF])
    }

    @Test func correlationBytesOfADecodedRequest() throws {
        let text = #"{"correlation":"C0FFEE"}"#
        let hex = try #require(try decode(text).correlationHex)
        #expect(correlationBytes(string(hex, of: text)!) == [0xC0, 0xFF, 0xEE])
    }

    // MARK: every rule, by name

    @Test func formatIsOneOfTwoWords() {
        #expect(refusal(#"{"format":"CBOR"}"#) == .malformed(at: 10, .fetchFormat))
        #expect(refusal(#"{"format":"xml"}"#) == .malformed(at: 10, .fetchFormat))
        #expect(refusal(#"{"format":""}"#) == .malformed(at: 10, .fetchFormat))
        #expect(refusal(#"{"format":"json "}"#) == .malformed(at: 10, .fetchFormat))
    }

    @Test func anUnknownKeyIsRefused() {
        // A typo must not pass silently.
        #expect(refusal(#"{"formats":"json"}"#) == .malformed(at: 1, .fetchUnknownKey))
        #expect(refusal(#"{"format":"json","Response_Topic":"a"}"#) == .malformed(at: 17, .fetchUnknownKey))
        #expect(refusal(#"{"responseTopic":"a"}"#) == .malformed(at: 1, .fetchUnknownKey))
        #expect(refusal(#"{"":"a"}"#) == .malformed(at: 1, .fetchUnknownKey))
    }

    @Test func aKeyTwiceIsRefused() {
        #expect(refusal(#"{"format":"cbor","format":"cbor"}"#) == .malformed(at: 17, .fetchDuplicateKey))
        #expect(refusal(#"{"response_topic":"a","format":"json","response_topic":"a"}"#) == .malformed(at: 38, .fetchDuplicateKey))
        #expect(refusal(#"{"correlation":"00","correlation":"11"}"#) == .malformed(at: 20, .fetchDuplicateKey))
    }

    @Test func everyValueIsAString() {
        #expect(refusal(#"{"format":1}"#) == .malformed(at: 10, .fetchType))
        #expect(refusal(#"{"format":null}"#) == .malformed(at: 10, .fetchType))
        #expect(refusal(#"{"response_topic":true}"#) == .malformed(at: 18, .fetchType))
        #expect(refusal(#"{"correlation":-1}"#) == .malformed(at: 15, .fetchType))
        #expect(refusal(#"{"correlation":12}"#) == .malformed(at: 15, .fetchType))
    }

    @Test func aNestedValueIsTheWrongType() {
        // The body is one flat object.
        #expect(refusal(#"{"format":["json"]}"#) == .malformed(at: 10, .fetchType))
        #expect(refusal(#"{"correlation":{"a":"00"}}"#) == .malformed(at: 15, .fetchType))
        #expect(refusal(#"{"response_topic":{}}"#) == .malformed(at: 18, .fetchType))
    }

    @Test func stringsHaveNoEscapes() {
        // §2: none of these values needs one, so a value's bytes are the value.
        #expect(refusal(#"{"format":"js\u006fn"}"#) == .malformed(at: 13, .fetchSyntax))
        #expect(refusal(#"{"response_topic":"a\/b"}"#) == .malformed(at: 20, .fetchSyntax))
        #expect(refusal(#"{"form\u0061t":"json"}"#) == .malformed(at: 6, .fetchSyntax))
        #expect(refusal(#"{"correlation":"\"00"}"#) == .malformed(at: 16, .fetchSyntax))
    }

    @Test func jsonSyntaxIsStrict() {
        let cases: [(String, Int)] = [
            (#"[]"#, 0),                              // not an object
            (#"null"#, 0),
            (#""format""#, 0),
            (#"{"format" "json"}"#, 10),              // no colon
            (#"{"format":"json" "correlation":"00"}"#, 17), // no comma
            (#"{"format":"json",}"#, 17),             // trailing comma
            (#"{,"format":"json"}"#, 1),
            (#"{format:"json"}"#, 1),                 // unquoted key
            (#"{'format':'json'}"#, 1),               // single quotes
            (#"{"format":'json'}"#, 10),
            (#"{"format":json}"#, 10),                // a bare word
            ("{\"format\":\"js\u{9}on\"}", 13),       // a raw tab in a string
            ("{\"format\"\u{0B}:\"json\"}", 9),       // vertical tab is not JSON whitespace
        ]
        for (text, at) in cases {
            #expect(refusal(text) == .malformed(at: at, .fetchSyntax), "\(text)")
        }
    }

    @Test func keysAndOtherValuesAreUTF8() {
        var bytes = Array(#"{"format":"json"}"#.utf8)
        bytes[12] = 0xC0  // an overlong lead byte inside "json"
        #expect(refusal(bytes) == .malformed(at: 12, .fetchSyntax))
        bytes = Array(#"{"format":"json"}"#.utf8)
        bytes[3] = 0x80   // a stray continuation byte inside the key
        #expect(refusal(bytes) == .malformed(at: 3, .fetchSyntax))
    }

    @Test func onlyWhitespaceMayFollowTheObject() {
        #expect(refusal(#"{"format":"json"} x"#) == .trailing(at: 18, count: 1))
        #expect(refusal(#"{}{}"#) == .trailing(at: 2, count: 2))
        #expect(refusal("{}\0") == .trailing(at: 2, count: 1))
        #expect(refusal("{} \r\n\t") == nil)
    }

    @Test func everyCutOfAValidBodyIsTruncated() {
        let bodies = [
            #"{"format":"json","response_topic":"kitchen/tv/answer","correlation":"0a1B"}"#,
            " { \"response_topic\" : \"büro/🏠\" } ",
        ]
        for text in bodies {
            let bytes = Array(text.utf8)
            let close = bytes.lastIndex(of: UInt8(ascii: "}"))!
            // Cuts inside the leading whitespace are empty bodies, which are fine.
            let open = bytes.firstIndex(of: UInt8(ascii: "{"))!
            for cut in open + 1 ... close {
                guard case .truncated(let at, let need)? = refusal(Array(bytes[..<cut])) else {
                    Issue.record("\(cut)-byte prefix of \(text): \(String(describing: refusal(Array(bytes[..<cut]))))")
                    continue
                }
                #expect(at == cut && need >= 1)
            }
            #expect(refusal(bytes) == nil)
        }
    }

    @Test func reasonNamesAreTheStatsKeys() {
        // A refused request is answered `bad-request` with this name, or dropped and counted under it.
        let names = [Malformed.fetchSyntax, .fetchUnknownKey, .fetchDuplicateKey, .fetchType, .fetchFormat,
                     .fetchResponseTopic, .fetchCorrelation, .fetchContinue].map(\.description)
        #expect(names == ["fetch-syntax", "fetch-unknown-key", "fetch-duplicate-key", "fetch-type", "fetch-format",
                          "fetch-response-topic", "fetch-correlation", "fetch-continue"])
    }
}
