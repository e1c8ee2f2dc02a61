// The ESPHome API messages and frames (docs/esphome.md §2, §3). Every server message vector
// is what aioesphomeapi 46.23.0's api_pb2 serialises for the same values, so Home Assistant's
// own decoder reads these exact bytes.
import BatonTestSupport
import BatonWire
import Testing
@testable import BatonProxy

func written<M: ServerMessage>(type: UInt32, _ m: M, capacity: Int = 512) throws -> [UInt8] {
    var out = [UInt8](repeating: 0, count: capacity)
    let n = try out.withUnsafeMutableBytes { buf in
        var w = ByteWriter(buf)
        try PlaintextFrame.write(type: type, m, to: &w)
        return w.count
    }
    return Array(out[..<n])
}

let hallInfo = DeviceInfo(name: "hall", macAddress: "02:BA:70:00:00:01", esphomeVersion: "2025.5.0", model: "Baton gateway",
                          manufacturer: "Baton", friendlyName: "Hall", bluetoothMacAddress: "00:1A:7D:DA:71:13",
                          encryptionSupported: true, projectName: "Baton.Baton gateway", projectVersion: "0.4.0")

/// §3.4: one advertisement of a BTHome v2 sensor (service data 0xFCD2: temperature 25.00 °C,
/// humidity 50.55 %) from A4:C1:38:AB:CD:EF, public, at −67 dBm.
let bthomeAddress: UInt64 = 0xA4C1_38AB_CDEF
let bthomeData = hx("02 01 06  0b 16 d2fc 40 00c4 02ca09 03bf13")

@Suite struct MessageTests {
    @Test func helloResponseSection3_1() throws {
        let frame = try written(type: MessageType.helloResponse,
                                HelloResponse(serverInfo: Array("Baton (ESPHome native API)".utf8), name: Array("hall".utf8)))
        #expect(frame == hx("""
            00 26 02
            08 01  10 0a
            1a 1a 4261746f6e2028455350486f6d65206e61746976652041504929
            22 04 68616c6c
            """))
    }

    @Test func deviceInfoResponseSection3_2CarriesTheFeatureFlags() throws {
        let frame = try written(type: MessageType.deviceInfoResponse, DeviceInfoResponse(hallInfo))
        #expect(frame == hx("""
            00 74 0a
            12 04 68616c6c
            1a 11 30323a42413a37303a30303a30303a3031
            22 08 323032352e352e30
            32 0d 4261746f6e2067617465776179
            42 13 4261746f6e2e4261746f6e2067617465776179
            4a 05 302e342e30
            62 05 4261746f6e
            6a 04 48616c6c
            78 61
            9201 11 30303a31413a37443a44413a37313a3133
            9801 01
            """))
        // 0x61 = 97 = passive scan 1 | raw advertisements 32 | state and mode 64.
        #expect(ProxyFeature.baton == 97)
        // With connections (docs/esphome.md §11): | active connections 2 | remote caching 4.
        #expect(ProxyFeature.batonConnecting == 103)
    }

    @Test func rawAdvertisementsSection3_4() throws {
        var batch = [UInt8](repeating: 0, count: 256)
        let n = try batch.withUnsafeMutableBytes { buf in
            var w = ByteWriter(buf)
            try bthomeData.withUnsafeBytes {
                try RawAdvertisement.append(address: bthomeAddress, addressType: 0, rssi: -67, data: $0, to: &w)
            }
            try hx("0201060302aafe").withUnsafeBytes {
                try RawAdvertisement.append(address: 0xC0FF_EE00_0001, addressType: 1, rssi: -40, data: $0, to: &w)
            }
            return w.count
        }
        #expect(Array(batch[..<n]) == hx("""
            0a 1d  08 ef9bafc5939829  10 8501  22 10 0201060b16d2fc4000c402ca0903bf13
            0a 15  08 818080f0fe9f30  10 4f  18 01  22 07 0201060302aafe
            """))
    }

    @Test func scannerStateOmitsItsZeroFields() throws {
        let frame = try written(type: MessageType.bluetoothScannerStateResponse,
                                ScannerStateResponse(state: ScannerState.running, mode: ScannerMode.passive, configuredMode: ScannerMode.passive))
        #expect(frame == hx("00 02 7e 08 02"))
    }

    @Test func anEncoderWithoutRoomThrowsNoRoomAndWritesNothing() throws {
        #expect(throws: WireError.noRoom(need: 119, have: 50)) {
            _ = try written(type: MessageType.deviceInfoResponse, DeviceInfoResponse(hallInfo), capacity: 50)
        }
    }

    @Test func helloRequestFromAioesphomeapi() throws {
        let body = hx("0a 0d 61696f657370686f6d65617069  10 01  18 0c")
        let m = try body.withUnsafeBytes { try ClientMessage.decode(type: MessageType.helloRequest, body: $0) }
        #expect(m == .hello(clientInfo: 2..<15, major: 1, minor: 12))
    }

    @Test func subscribeAndSetMode() throws {
        let sub = try hx("08 01").withUnsafeBytes { try ClientMessage.decode(type: 66, body: $0) }
        #expect(sub == .subscribeAdvertisements(flags: 1))
        let mode = try hx("08 01").withUnsafeBytes { try ClientMessage.decode(type: 127, body: $0) }
        #expect(mode == .setScannerMode(ScannerMode.active))
    }

    @Test func unknownFieldsOfEveryWireTypeAreSkipped() throws {
        // Field 9 varint, field 10 fixed64, field 11 length-delimited, field 12 fixed32, then flags.
        let body = hx("48 96 01  51 0102030405060708  5a 03 616263  65 01020304  08 01")
        let m = try body.withUnsafeBytes { try ClientMessage.decode(type: 66, body: $0) }
        #expect(m == .subscribeAdvertisements(flags: 1))
    }

    @Test func anUnknownMessageIsOtherAndAnEmptyBodyIsValid() throws {
        #expect(try [UInt8]().withUnsafeBytes { try ClientMessage.decode(type: 9999, body: $0) } == .other(type: 9999))
        #expect(try [UInt8]().withUnsafeBytes { try ClientMessage.decode(type: 7, body: $0) } == .pingRequest)
    }

    @Test func badProtobufThrowsWhereItBreaks() throws {
        let cases: [([UInt8], WireError)] = [
            (hx("08"), .truncated(at: 1, need: 1)),                          // varint cut off
            (hx("0a 05 6162"), .badLength(at: 1, length: 5)),                 // length past the end
            (hx("0b"), .malformed(at: 0, .wireType)),                         // wire type 3 (group)
            (hx("00 01"), .malformed(at: 0, .fieldZero)),                     // field 0
            (hx("08 ffffffffffffffffff02"), .malformed(at: 10, .varintTooLong)),   // 10th byte > 1
            (hx("08 ffffffffffffffffffff01"), .malformed(at: 10, .varintTooLong)), // 11 bytes
            (hx("0d 010203"), .truncated(at: 1, need: 1)),                    // fixed32 short
        ]
        for (body, error) in cases {
            #expect(throws: error) { try body.withUnsafeBytes { try ClientMessage.decode(type: 7, body: $0) } }
        }
    }

    @Test func theLargestVarintIsTenBytes() throws {
        var r = hx("ffffffffffffffffff01")
        let v = try r.withUnsafeBytes { b in var rd = ByteReader(b); return try Protobuf.readVarint(&rd) }
        #expect(v == UInt64.max)
        #expect(Protobuf.varintSize(UInt64.max) == 10)
        #expect(Protobuf.varintSize(0) == 1 && Protobuf.varintSize(127) == 1 && Protobuf.varintSize(128) == 2)
        r = []
        #expect(Protobuf.zigzag(-67) == 133 && Protobuf.unzigzag(133) == -67 && Protobuf.unzigzag(Protobuf.zigzag(Int32.min)) == Int32.min)
    }
}

@Suite struct FrameTests {
    @Test func aPlaintextFrameDripFedNeedsMoreUntilWhole() throws {
        // §2.1: PingRequest (7, empty) then SubscribeBluetoothLEAdvertisementsRequest (66, flags 1),
        // between guard bytes that must not be read.
        let stream = hx("00 00 07  00 02 42 08 01")
        var got: [FrameResult] = []
        var buffer: [UInt8] = []
        for b in stream {
            buffer.append(b)
            let guarded = buffer + [0xEE]
            let r = try guarded.withUnsafeBytes { try PlaintextFrame.decode(UnsafeRawBufferPointer(rebasing: $0[..<buffer.count]), maxBody: 100) }
            if case .frame(_, _, let length) = r {
                got.append(r)
                buffer.removeFirst(length)
            }
        }
        #expect(got == [.frame(type: 7, payload: 3..<3, length: 3), .frame(type: 66, payload: 3..<5, length: 5)])
        #expect(buffer.isEmpty)
    }

    @Test func aPlaintextFrameLongerThanTheBufferIsRefusedAtItsLength() throws {
        #expect(throws: WireError.badLength(at: 1, length: 300)) {
            try hx("00 ac02").withUnsafeBytes { try PlaintextFrame.decode($0, maxBody: 299) }
        }
        #expect(throws: WireError.malformed(at: 0, .indicator)) {
            try hx("01 00 00").withUnsafeBytes { try PlaintextFrame.decode($0, maxBody: 100) }
        }
        #expect(throws: WireError.malformed(at: 10, .varintTooLong)) {
            try hx("00 80808080808080808080").withUnsafeBytes { try PlaintextFrame.decode($0, maxBody: 100) }
        }
    }

    @Test func aNoiseFrameSection2_2() throws {
        // The client's hello (empty) and its handshake frame's first bytes.
        #expect(try hx("01 00 00").withUnsafeBytes { try NoiseFrame.decode($0, maxBody: 100) } == .frame(type: 0, payload: 3..<3, length: 3))
        #expect(try hx("01 00 31 00").withUnsafeBytes { try NoiseFrame.decode($0, maxBody: 100) } == .needMore)
        #expect(try hx("01 00").withUnsafeBytes { try NoiseFrame.decode($0, maxBody: 100) } == .needMore)
        #expect(throws: WireError.badLength(at: 1, length: 0x1000)) {
            try hx("01 10 00").withUnsafeBytes { try NoiseFrame.decode($0, maxBody: 1021) }
        }
        #expect(throws: WireError.malformed(at: 0, .indicator)) {
            try hx("00 00 07").withUnsafeBytes { try NoiseFrame.decode($0, maxBody: 100) }
        }
    }

    @Test func aNoiseMessagesInnerLengthMustFillIt() throws {
        let ok = try hx("0042 0002 0801").withUnsafeBytes { try NoiseFrame.decodeMessage($0) }
        #expect(ok.type == 66 && ok.body == 4..<6)
        #expect(throws: WireError.malformed(at: 2, .innerLength)) {
            try hx("0042 0003 0801").withUnsafeBytes { try NoiseFrame.decodeMessage($0) }
        }
        #expect(throws: WireError.truncated(at: 2, need: 1)) {
            try hx("0042 00").withUnsafeBytes { try NoiseFrame.decodeMessage($0) }
        }
    }

    @Test func theKeyIsBase64OfExactly32Bytes() {
        #expect(ProxySettings.key(base64: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=") == Array(0...31))
        #expect(ProxySettings.key(base64: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8") == nil)  // no padding
        #expect(ProxySettings.key(base64: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh=") == nil)  // 31 bytes
        #expect(ProxySettings.key(base64: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh9=") == nil)  // non-zero spare bits
        #expect(ProxySettings.key(base64: "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdH!8=") == nil)
        #expect(ProxySettings.compactMAC(0x02BA_7000_0001) == "02ba70000001")
        #expect(ProxySettings.macText(0x02BA_7000_0001) == "02:BA:70:00:00:01")
        #expect(ProxySettings.parseMAC("02:ba:70:00:00:01") == 0x02BA_7000_0001)
        #expect(ProxySettings.parseMAC("02:ba:70:00:00") == nil)
    }
}
