// HCI command encoding and Command Complete / Command Status parsing, as bytes.
// Spec: Core 5.4, Vol 4, Part E (HCI functional specification); H4 indicator from Vol 4,
// Part A, §2; status codes from Vol 1, Part F, §1.3.

import Testing
import BatonTestSupport
import BatonWire
@testable import BatonHCI

/// The H4 frame `command` encodes to, as "01 03 0C 00".
private func encoded(_ command: HCICommand) throws -> String {
    var storage = [UInt8](repeating: 0xEE, count: 64)
    let n = try storage.withUnsafeMutableBytes { buf in
        var w = ByteWriter(buf)
        try command.encode(into: &w)
        return w.count
    }
    #expect(n == command.encodedLength)
    #expect(storage[n] == 0xEE, "wrote past its length")
    return spacedHex(storage[..<n])
}

private func parse(_ hex: String) throws -> HCICommandResponse? {
    try hx(hex).withUnsafeBytes { try HCICommandResponse.parse(event: $0) }
}

private func parseError(_ hex: String) -> WireError? {
    do {
        _ = try parse(hex)
        return nil
    } catch {
        return error as? WireError
    }
}

@Suite("HCICommand encoding, Core 5.4 Vol 4 Part E")
struct HCICommandTests {
    // MARK: Commands, byte-exact

    @Test("§7.3.2 HCI_Reset: opcode 0x0C03, no parameters")
    func reset() throws {
        #expect(try encoded(.reset) == "01 03 0C 00")
    }

    @Test("§7.3.1 HCI_Set_Event_Mask: Hardware Error (bit 15) + LE Meta (bit 61)")
    func setEventMask() throws {
        #expect(EventMask.scanner == 0x2000_0000_0000_8000)
        #expect(try encoded(.setEventMask(EventMask.scanner)) == "01 01 0C 08 00 80 00 00 00 00 00 20")
    }

    @Test("§7.4.1 HCI_Read_Local_Version_Information: opcode 0x1001, no parameters")
    func readLocalVersion() throws {
        #expect(try encoded(.readLocalVersionInformation) == "01 01 10 00")
    }

    @Test("§7.8.3 HCI_LE_Read_Local_Supported_Features: opcode 0x2003, no parameters")
    func leReadFeatures() throws {
        #expect(try encoded(.leReadLocalSupportedFeatures) == "01 03 20 00")
    }

    @Test("§7.8.1 HCI_LE_Set_Event_Mask: LE Advertising Report (bit 1) + LE Extended Advertising Report (bit 12)")
    func leSetEventMask() throws {
        let mask = EventMask.leAdvertisingReport | EventMask.leExtendedAdvertisingReport
        #expect(mask == 0x1002)
        #expect(try encoded(.leSetEventMask(mask)) == "01 01 20 08 02 10 00 00 00 00 00 00")
        #expect(try encoded(.leSetEventMask(EventMask.leAdvertisingReport)) == "01 01 20 08 02 00 00 00 00 00 00 00")
    }

    @Test("§7.8.10 HCI_LE_Set_Scan_Parameters: passive, 60 ms interval = 60 ms window, public, accept all")
    func leSetScanParametersPassive() throws {
        #expect(try encoded(.leSetScanParameters(.default)) == "01 0B 20 07 00 60 00 60 00 00 00")
    }

    @Test("§7.8.10 HCI_LE_Set_Scan_Parameters: active, 10 ms, random own address, boundary intervals")
    func leSetScanParametersActive() throws {
        let p = try ScanParameters(type: .active, interval: 0x0010, ownAddressType: 0x01)
        #expect(try encoded(.leSetScanParameters(p)) == "01 0B 20 07 01 10 00 10 00 01 00")
        // The range ends: 0x0004 (2.5 ms) and 0x4000 (10.24 s).
        #expect(try encoded(.leSetScanParameters(ScanParameters(interval: 0x0004))) == "01 0B 20 07 00 04 00 04 00 00 00")
        #expect(try encoded(.leSetScanParameters(ScanParameters(interval: 0x4000))) == "01 0B 20 07 00 00 40 00 40 00 00")
    }

    @Test("§7.8.11 HCI_LE_Set_Scan_Enable: enable with Filter_Duplicates off; disable")
    func leSetScanEnable() throws {
        #expect(try encoded(.leSetScanEnable(enable: true, filterDuplicates: false)) == "01 0C 20 02 01 00")
        #expect(try encoded(.leSetScanEnable(enable: false, filterDuplicates: false)) == "01 0C 20 02 00 00")
        #expect(try encoded(.leSetScanEnable(enable: true, filterDuplicates: true)) == "01 0C 20 02 01 01")
    }

    @Test("§7.8.64 HCI_LE_Set_Extended_Scan_Parameters: LE 1M only, window = interval")
    func leSetExtendedScanParameters() throws {
        // Own_Address_Type 00, Scanning_Filter_Policy 00, Scanning_PHYs 01 (1M),
        // Scan_Type[0] 00, Scan_Interval[0] 0x0060, Scan_Window[0] 0x0060.
        #expect(try encoded(.leSetExtendedScanParameters(.default)) == "01 41 20 08 00 00 01 00 60 00 60 00")
        let p = try ScanParameters(type: .active, interval: 0x0030, ownAddressType: 0x01)
        #expect(try encoded(.leSetExtendedScanParameters(p)) == "01 41 20 08 01 00 01 01 30 00 30 00")
    }

    @Test("§7.8.65 HCI_LE_Set_Extended_Scan_Enable: Duration 0 and Period 0 scan until disabled")
    func leSetExtendedScanEnable() throws {
        #expect(try encoded(.leSetExtendedScanEnable(enable: true, filterDuplicates: false)) == "01 42 20 06 01 00 00 00 00 00")
        #expect(try encoded(.leSetExtendedScanEnable(enable: false, filterDuplicates: false)) == "01 42 20 06 00 00 00 00 00 00")
    }

    @Test("Every command fits maxEncodedLength; a buffer one byte short gets .noRoom and no bytes")
    func noRoom() throws {
        let all: [HCICommand] = [
            .reset, .setEventMask(1), .readLocalVersionInformation, .leSetEventMask(2),
            .leReadLocalSupportedFeatures, .leSetScanParameters(.default),
            .leSetScanEnable(enable: true, filterDuplicates: false), .leSetExtendedScanParameters(.default),
            .leSetExtendedScanEnable(enable: true, filterDuplicates: false),
        ]
        for c in all {
            #expect(c.encodedLength <= HCICommand.maxEncodedLength)
            var storage = [UInt8](repeating: 0, count: c.encodedLength - 1)
            storage.withUnsafeMutableBytes { buf in
                var w = ByteWriter(buf)
                #expect(throws: WireError.noRoom(need: c.encodedLength, have: c.encodedLength - 1)) {
                    try c.encode(into: &w)
                }
                #expect(w.count == 0)
            }
        }
        // Exactly enough room works.
        var exact = [UInt8](repeating: 0, count: 4)
        try exact.withUnsafeMutableBytes { buf in
            var w = ByteWriter(buf)
            try HCICommand.reset.encode(into: &w)
            #expect(w.count == 4)
        }
    }

    // MARK: Opcodes, statuses, errors

    @Test("§5.4.1 opcode = OGF << 10 | OCF; names and descriptions")
    func opcodes() {
        #expect(HCIOpcode(ogf: 0x08, ocf: 0x000B) == .leSetScanParameters)
        #expect(HCIOpcode.reset.ogf == 0x03 && HCIOpcode.reset.ocf == 0x003)
        #expect(HCIOpcode.leSetExtendedScanEnable.ogf == 0x08 && HCIOpcode.leSetExtendedScanEnable.ocf == 0x042)
        #expect(HCIOpcode.reset.description == "HCI_Reset (0x0C03)")
        #expect(HCIOpcode.leSetScanParameters.description == "HCI_LE_Set_Scan_Parameters (0x200B)")
        #expect(HCIOpcode(rawValue: 0xFC01).description == "opcode 0xFC01 (OGF 0x3F, OCF 0x001)")
    }

    @Test("Vol 1 Part F §1.3 status names")
    func statuses() {
        #expect(HCIStatus.commandDisallowed.description == "Command Disallowed (0x0C)")
        #expect(HCIStatus.unknownCommand.description == "Unknown HCI Command (0x01)")
        #expect(HCIStatus.invalidCommandParameters.description == "Invalid HCI Command Parameters (0x12)")
        #expect(HCIStatus(rawValue: 0x5A).description == "error 0x5A")
    }

    @Test("ControllerError names the command and the status")
    func controllerErrorText() {
        let e = ControllerError.commandFailed(.leSetScanParameters, .invalidCommandParameters)
        #expect(e.description == "the Bluetooth controller refused HCI_LE_Set_Scan_Parameters (0x200B): Invalid HCI Command Parameters (0x12)")
        #expect(RadioError.controller(e).description == e.description)
        #expect(ControllerError.hardwareError(code: 0x2A).description == "the Bluetooth controller reported a hardware error (code 0x2A)")
    }

    @Test("Scan interval: 0x0004…0x4000 (§7.8.10), one past each end refused; milliseconds convert")
    func scanIntervalRange() throws {
        #expect(throws: RadioError.self) { try ScanParameters(interval: 0x0003) }
        #expect(throws: RadioError.self) { try ScanParameters(interval: 0x4001) }
        #expect(throws: RadioError.self) { try ScanParameters(interval: 0x0060, ownAddressType: 4) }
        #expect(throws: RadioError.self) { try ScanParameters(interval: 0x0060, filterPolicy: 4) }
        #expect(try ScanParameters(intervalMilliseconds: 2.5).interval == 0x0004)
        #expect(try ScanParameters(intervalMilliseconds: 60).interval == 0x0060)
        #expect(try ScanParameters(intervalMilliseconds: 10240).interval == 0x4000)
        #expect(throws: RadioError.self) { try ScanParameters(intervalMilliseconds: 2.4) }
        #expect(throws: RadioError.self) { try ScanParameters(intervalMilliseconds: 10240.7) }
        #expect(throws: RadioError.self) { try ScanParameters(intervalMilliseconds: .nan) }
        do {
            _ = try ScanParameters(interval: 2)
            Issue.record("interval 2 accepted")
        } catch {
            #expect(error.description == "invalid radio configuration: scan interval 2 × 0.625 ms is outside 4…16384 (2.5 ms … 10.24 s)")
        }
    }

    // MARK: Command Complete / Command Status

    @Test("§7.7.14 Command Complete for HCI_Reset: 1 credit, success, no return parameters")
    func commandCompleteReset() throws {
        let r = try #require(try parse("0E 04 01 03 0C 00"))
        #expect(r.kind == .complete)
        #expect(r.credits == 1)
        #expect(r.opcode == .reset)
        #expect(r.status == .success)
        #expect(r.returnParameters == 6 ..< 6)
    }

    @Test("§7.7.14 Command Complete with an error status and with 0 credits")
    func commandCompleteError() throws {
        let r = try #require(try parse("0E 04 00 0B 20 12"))
        #expect(r.credits == 0)
        #expect(r.opcode == .leSetScanParameters)
        #expect(r.status == .invalidCommandParameters)
    }

    @Test("§7.7.14 NOP Command Complete (opcode 0x0000) only grants credits")
    func commandCompleteNop() throws {
        let r = try #require(try parse("0E 03 05 00 00"))
        #expect(r.opcode == .nop)
        #expect(r.credits == 5)
        #expect(r.status == .success)
    }

    @Test("§7.7.15 Command Status: Status, Num_HCI_Command_Packets, Opcode")
    func commandStatus() throws {
        let r = try #require(try parse("0F 04 0C 01 0B 20"))
        #expect(r.kind == .status)
        #expect(r.status == .commandDisallowed)
        #expect(r.credits == 1)
        #expect(r.opcode == .leSetScanParameters)
    }

    @Test("Other events are not command responses")
    func otherEvents() throws {
        #expect(try parse("3E 03 02 00 00") == nil)
        #expect(try parse("10 01 05") == nil)
    }

    @Test("Malformed responses: empty, truncated, overlong, no status, short/long Command Status")
    func malformed() {
        #expect(parseError("") == .truncated(at: 0, need: 1))
        #expect(parseError("0E") == .truncated(at: 1, need: 1))
        // Declares 4 parameter bytes, holds 3.
        #expect(parseError("0E 04 01 03 0C") == .truncated(at: 2, need: 1))
        // One byte past the declared length.
        #expect(parseError("0E 04 01 03 0C 00 FF") == .trailing(at: 6, count: 1))
        // A real opcode without its Status.
        #expect(parseError("0E 03 01 03 0C") == .malformed(at: 5, .commandCompleteWithoutStatus))
        // Fixed part of Command Complete cut short.
        #expect(parseError("0E 02 01 03") == .truncated(at: 3, need: 1))
        // Command Status is exactly 4 parameter bytes.
        #expect(parseError("0F 03 00 01 0B") == .truncated(at: 4, need: 1))
        #expect(parseError("0F 05 00 01 0B 20 00") == .trailing(at: 6, count: 1))
    }

    @Test("§7.4.1 return parameters: HCI 5.2, company 0x0002")
    func localVersion() throws {
        let event = hx("0E 0C 01 01 10 00 0B 00 01 0B 02 00 09 22")
        let v = try event.withUnsafeBytes { raw in
            let r = try #require(try HCICommandResponse.parse(event: raw))
            #expect(r.opcode == .readLocalVersionInformation)
            return try HCILocalVersion.parse(UnsafeRawBufferPointer(rebasing: raw[r.returnParameters]))
        }
        #expect(v == HCILocalVersion(hciVersion: 0x0B, hciSubversion: 0x0100, lmpVersion: 0x0B,
                                     companyIdentifier: 0x0002, lmpSubversion: 0x2209))
        #expect(v.coreVersion == "5.2")
        // One byte short of the 8 parameters after Status.
        let short = hx("0B 00 01 0B 02 00 09")
        #expect(throws: WireError.truncated(at: 0, need: 1)) {
            try short.withUnsafeBytes { try HCILocalVersion.parse($0) }
        }
    }

    @Test("Vol 6 Part B §4.6 LE features: bit 12 LE Extended Advertising")
    func leFeatures() throws {
        func features(_ hex: String) throws -> LEFeatures {
            let event = hx(hex)
            return try event.withUnsafeBytes { raw in
                let r = try #require(try HCICommandResponse.parse(event: raw))
                return try LEFeatures.parse(UnsafeRawBufferPointer(rebasing: raw[r.returnParameters]))
            }
        }
        // A 5.x controller: bits 0–8, 11, 12 (0x19FF).
        let five = try features("0E 0C 01 03 20 00 FF 19 00 00 00 00 00 00")
        #expect(five.contains(.extendedAdvertising))
        #expect(five.contains(.leCodedPHY))
        // A 4.2 controller: bits 0–5 only.
        let fourTwo = try features("0E 0C 01 03 20 00 3F 00 00 00 00 00 00 00")
        #expect(!fourTwo.contains(.extendedAdvertising))
        // Seven feature bytes instead of eight.
        #expect(throws: WireError.truncated(at: 0, need: 1)) {
            try hx("FF 19 00 00 00 00 00").withUnsafeBytes { try LEFeatures.parse($0) }
        }
    }
}
