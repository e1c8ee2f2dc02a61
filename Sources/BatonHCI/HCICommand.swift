// HCI commands the radio sources send, and the two events that answer them.
//
// Commands: Core 5.4, Vol 4, Part E, §5.4.1 (packet: Opcode LE16 = OGF << 10 | OCF,
// Parameter_Total_Length, parameters) inside an H4 frame (Vol 4, Part A, §2: indicator 0x01).
// The BlueZ raw HCI socket takes exactly the same bytes, indicator included (BlueZ
// lib/hci.c `hci_send_cmd` writes the type byte, the header, then the parameters), so one
// encoder serves both transports.
//
// Answers: Command Complete (§7.7.14) and Command Status (§7.7.15). Both carry
// Num_HCI_Command_Packets, the controller's command credits (§4.4 "Command flow control").
// A non-zero status is the controller refusing the command: a `ControllerError`, never a
// `WireError` (the bytes were fine, the controller said no).

public import BatonWire
import BatonLibc

// MARK: - Opcodes

/// An HCI command opcode, Core 5.4, Vol 4, Part E, §5.4.1: OGF in the top 6 bits, OCF in the
/// low 10, sent little-endian.
public struct HCIOpcode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt16

    public init(rawValue: UInt16) { self.rawValue = rawValue }

    public init(ogf: UInt8, ocf: UInt16) {
        precondition(ogf < 0x40 && ocf < 0x400, "OGF is 6 bits and OCF 10 bits")
        rawValue = UInt16(ogf) << 10 | ocf
    }

    public var ogf: UInt8 { UInt8(truncatingIfNeeded: rawValue >> 10) }
    public var ocf: UInt16 { rawValue & 0x03FF }

    /// §7.7.14: a Command Complete with opcode 0x0000 answers no command; it only grants
    /// credits (controllers send it after power-on and to reopen flow control).
    public static let nop = HCIOpcode(rawValue: 0x0000)
    /// §7.3.1 Set_Event_Mask (OGF 0x03 Controller & Baseband, OCF 0x0001).
    public static let setEventMask = HCIOpcode(rawValue: 0x0C01)
    /// §7.3.2 Reset (OGF 0x03, OCF 0x0003).
    public static let reset = HCIOpcode(rawValue: 0x0C03)
    /// §7.4.1 Read_Local_Version_Information (OGF 0x04 Informational, OCF 0x0001).
    public static let readLocalVersionInformation = HCIOpcode(rawValue: 0x1001)
    /// §7.8.1 LE_Set_Event_Mask (OGF 0x08 LE Controller, OCF 0x0001).
    public static let leSetEventMask = HCIOpcode(rawValue: 0x2001)
    /// §7.8.3 LE_Read_Local_Supported_Features (OGF 0x08, OCF 0x0003).
    public static let leReadLocalSupportedFeatures = HCIOpcode(rawValue: 0x2003)
    /// §7.8.10 LE_Set_Scan_Parameters (OGF 0x08, OCF 0x000B).
    public static let leSetScanParameters = HCIOpcode(rawValue: 0x200B)
    /// §7.8.11 LE_Set_Scan_Enable (OGF 0x08, OCF 0x000C).
    public static let leSetScanEnable = HCIOpcode(rawValue: 0x200C)
    /// §7.8.64 LE_Set_Extended_Scan_Parameters (OGF 0x08, OCF 0x0041).
    public static let leSetExtendedScanParameters = HCIOpcode(rawValue: 0x2041)
    /// §7.8.65 LE_Set_Extended_Scan_Enable (OGF 0x08, OCF 0x0042).
    public static let leSetExtendedScanEnable = HCIOpcode(rawValue: 0x2042)

    /// The spec's name for the commands Baton sends; `nil` for any other opcode.
    public var name: StaticString? {
        switch rawValue {
        case 0x0000: "NOP"
        case 0x0C01: "HCI_Set_Event_Mask"
        case 0x0C03: "HCI_Reset"
        case 0x1001: "HCI_Read_Local_Version_Information"
        case 0x2001: "HCI_LE_Set_Event_Mask"
        case 0x2003: "HCI_LE_Read_Local_Supported_Features"
        case 0x200B: "HCI_LE_Set_Scan_Parameters"
        case 0x200C: "HCI_LE_Set_Scan_Enable"
        case 0x2041: "HCI_LE_Set_Extended_Scan_Parameters"
        case 0x2042: "HCI_LE_Set_Extended_Scan_Enable"
        default: nil
        }
    }

    /// "HCI_Reset (0x0C03)", or "opcode 0xFC01 (OGF 0x3F, OCF 0x001)" for one we do not name.
    public var description: String {
        if let name { return "\(name) (\(hex(rawValue, digits: 4)))" }
        return "opcode \(hex(rawValue, digits: 4)) (OGF \(hex(UInt16(ogf), digits: 2)), OCF \(hex(ocf, digits: 3)))"
    }
}

/// "0x0C03": upper-case hex with a fixed number of digits, as the spec writes opcodes.
private func hex(_ v: UInt16, digits: Int) -> String { "0x" + Hex.text(v, digits: digits, uppercase: true) }

// MARK: - Status codes

/// An HCI status / error code, Core 5.4, Vol 1, Part F, §1.3 (Table 1.1) and §2.
public struct HCIStatus: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public let rawValue: UInt8

    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let success = HCIStatus(rawValue: 0x00)
    /// The controller does not know the opcode (e.g. extended scanning on a 4.x chip).
    public static let unknownCommand = HCIStatus(rawValue: 0x01)
    public static let hardwareFailure = HCIStatus(rawValue: 0x03)
    public static let memoryCapacityExceeded = HCIStatus(rawValue: 0x07)
    /// Not allowed now, e.g. scan parameters while scanning, or a legacy scan command
    /// after extended advertising commands (Vol 4, Part E, §3.1.1 forbids mixing them).
    public static let commandDisallowed = HCIStatus(rawValue: 0x0C)
    public static let unsupportedFeatureOrParameterValue = HCIStatus(rawValue: 0x11)
    public static let invalidCommandParameters = HCIStatus(rawValue: 0x12)
    public static let unspecifiedError = HCIStatus(rawValue: 0x1F)
    public static let controllerBusy = HCIStatus(rawValue: 0x3A)

    /// The name Vol 1, Part F, §1.3 gives the code; `nil` for codes Baton does not name.
    public var name: StaticString? {
        switch rawValue {
        case 0x00: "Success"
        case 0x01: "Unknown HCI Command"
        case 0x02: "Unknown Connection Identifier"
        case 0x03: "Hardware Failure"
        case 0x04: "Page Timeout"
        case 0x05: "Authentication Failure"
        case 0x06: "PIN or Key Missing"
        case 0x07: "Memory Capacity Exceeded"
        case 0x08: "Connection Timeout"
        case 0x09: "Connection Limit Exceeded"
        case 0x0C: "Command Disallowed"
        case 0x0D: "Connection Rejected due to Limited Resources"
        case 0x11: "Unsupported Feature or Parameter Value"
        case 0x12: "Invalid HCI Command Parameters"
        case 0x13: "Remote User Terminated Connection"
        case 0x16: "Connection Terminated by Local Host"
        case 0x1A: "Unsupported Remote Feature"
        case 0x1F: "Unspecified Error"
        case 0x20: "Unsupported LL Parameter Value"
        case 0x22: "LL Response Timeout"
        case 0x3A: "Controller Busy"
        case 0x3B: "Unacceptable Connection Parameters"
        case 0x3C: "Advertising Timeout"
        case 0x3E: "Connection Failed to be Established"
        case 0x42: "Unknown Advertising Identifier"
        case 0x43: "Limit Reached"
        case 0x44: "Operation Cancelled by Host"
        case 0x45: "Packet Too Long"
        default: nil
        }
    }

    /// "Command Disallowed (0x0C)", or "error 0x5A" for a code Baton does not name.
    public var description: String {
        let code = "0x" + Hex.text(rawValue, digits: 2, uppercase: true)
        if let name { return "\(name) (\(code))" }
        return "error \(code)"
    }
}

// MARK: - Controller errors

/// The controller broke HCI or refused us (architecture.md §5.3): distinct from `WireError`
/// (malformed bytes) and `Errno` (the OS). Each says which command and what the controller did.
public enum ControllerError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Command Complete / Command Status for `opcode` carried a non-zero status.
    case commandFailed(HCIOpcode, HCIStatus)
    /// No Command Complete / Status for `opcode` within `after` (Vol 4, Part E, §4.4 leaves
    /// the timeout to the host; Linux uses 2 s, HCI_CMD_TIMEOUT).
    case commandTimeout(HCIOpcode, after: Duration)
    /// The controller left Num_HCI_Command_Packets at 0 for `after`, so `opcode` could not be sent.
    case noCommandCredit(HCIOpcode, after: Duration)
    /// A Hardware Error event (§7.7.16) with its vendor-specific Hardware_Code: the controller
    /// needs a Reset, i.e. the source needs `start(now:)`.
    case hardwareError(code: UInt8)

    public var description: String {
        switch self {
        case .commandFailed(let op, let status):
            "the Bluetooth controller refused \(op): \(status)"
        case .commandTimeout(let op, let after):
            "the Bluetooth controller did not answer \(op) within \(after.secondsDescription)"
        case .noCommandCredit(let op, let after):
            "the Bluetooth controller granted no command credit for \(after.secondsDescription), so \(op) could not be sent"
        case .hardwareError(let code):
            "the Bluetooth controller reported a hardware error (code 0x\(Hex.text(code, digits: 2, uppercase: true)))"
        }
    }
}

// MARK: - Scan parameters

/// LE_Scan_Type, §7.8.10 (and Scan_Type[i], §7.8.64).
public enum ScanType: UInt8, Sendable, Equatable {
    /// Listen only: no SCAN_REQ goes out, so the gateway stays invisible to devices.
    case passive = 0x00
    /// Send SCAN_REQ and also receive scan responses.
    case active = 0x01
}

/// What the controller is told to scan with. The scan window always equals the interval: the
/// controller listens continuously (Vol 6, Part B, §4.4.3) instead of on a duty cycle, because
/// a beacon missed is a room change noticed late.
public struct ScanParameters: Sendable, Equatable {
    public let type: ScanType
    /// LE_Scan_Interval and LE_Scan_Window, in units of 0.625 ms.
    public let interval: UInt16
    /// Own_Address_Type (§7.8.10): 0x00 public, 0x01 random. Only matters for active scanning.
    public let ownAddressType: UInt8
    /// Scanning_Filter_Policy (§7.8.10): 0x00 accepts every advertisement.
    public let filterPolicy: UInt8

    /// §7.8.10: LE_Scan_Interval range 0x0004…0x4000 (2.5 ms … 10.24 s). §7.8.64 allows up to
    /// 0xFFFF; the legacy range is used for both so one setting works in either mode.
    public static let intervalRange: ClosedRange<UInt16> = 0x0004 ... 0x4000

    /// 0x0060 = 60 ms, the Linux kernel's default LE scan interval (its window is half that;
    /// ours is the whole interval).
    public static let `default` = ScanParameters(unchecked: .passive, interval: 0x0060, ownAddressType: 0, filterPolicy: 0)

    /// Throws `.invalidConfiguration` for values the controller would reject.
    public init(type: ScanType = .passive, interval: UInt16 = 0x0060, ownAddressType: UInt8 = 0x00,
                filterPolicy: UInt8 = 0x00) throws(RadioError) {
        guard Self.intervalRange.contains(interval) else {
            throw .invalidConfiguration("scan interval \(interval) × 0.625 ms is outside 4…16384 (2.5 ms … 10.24 s)")
        }
        // §7.8.10: Own_Address_Type 0x00…0x03; Scanning_Filter_Policy 0x00…0x03.
        guard ownAddressType <= 0x03 else {
            throw .invalidConfiguration("own address type \(ownAddressType) is outside 0…3")
        }
        guard filterPolicy <= 0x03 else {
            throw .invalidConfiguration("scanning filter policy \(filterPolicy) is outside 0…3")
        }
        self.init(unchecked: type, interval: interval, ownAddressType: ownAddressType, filterPolicy: filterPolicy)
    }

    /// A scan interval in milliseconds (2.5 … 10240), rounded down to 0.625 ms units.
    public init(type: ScanType = .passive, intervalMilliseconds ms: Double) throws(RadioError) {
        guard ms.isFinite, ms >= 2.5, ms <= 10240 else {
            throw .invalidConfiguration("scan interval \(ms) ms is outside 2.5 … 10240 ms")
        }
        try self.init(type: type, interval: UInt16(ms / 0.625))
    }

    /// The same parameters with another scan type (Home Assistant's active windows).
    public func with(type: ScanType) -> ScanParameters {
        ScanParameters(unchecked: type, interval: interval, ownAddressType: ownAddressType, filterPolicy: filterPolicy)
    }

    private init(unchecked type: ScanType, interval: UInt16, ownAddressType: UInt8, filterPolicy: UInt8) {
        self.type = type
        self.interval = interval
        self.ownAddressType = ownAddressType
        self.filterPolicy = filterPolicy
    }
}

// MARK: - Event masks

/// Event mask bits the init sequence sets.
public enum EventMask {
    /// Set_Event_Mask (§7.3.1): bit 15 Hardware Error event (so a broken controller is noticed)
    /// and bit 61 LE Meta event (every advertising report is an LE Meta subevent). Command
    /// Complete/Status cannot be masked. Everything else stays off: a scanner needs nothing else.
    public static let scanner: UInt64 = 1 << 15 | 1 << 61
    /// LE_Set_Event_Mask (§7.8.1): bit 1 LE Advertising Report (subevent 0x02).
    public static let leAdvertisingReport: UInt64 = 1 << 1
    /// LE_Set_Event_Mask (§7.8.1): bit 12 LE Extended Advertising Report (subevent 0x0D).
    public static let leExtendedAdvertisingReport: UInt64 = 1 << 12
}

// MARK: - Commands

/// A command Baton sends, with its parameters. `encode(into:)` writes the whole H4 frame.
public enum HCICommand: Sendable, Equatable {
    /// §7.3.2 HCI_Reset: no parameters.
    case reset
    /// §7.3.1 HCI_Set_Event_Mask: Event_Mask (8 octets).
    case setEventMask(UInt64)
    /// §7.4.1 HCI_Read_Local_Version_Information: no parameters.
    case readLocalVersionInformation
    /// §7.8.1 HCI_LE_Set_Event_Mask: LE_Event_Mask (8 octets).
    case leSetEventMask(UInt64)
    /// §7.8.3 HCI_LE_Read_Local_Supported_Features: no parameters.
    case leReadLocalSupportedFeatures
    /// §7.8.10 HCI_LE_Set_Scan_Parameters (window = interval).
    case leSetScanParameters(ScanParameters)
    /// §7.8.11 HCI_LE_Set_Scan_Enable: LE_Scan_Enable, Filter_Duplicates.
    case leSetScanEnable(enable: Bool, filterDuplicates: Bool)
    /// §7.8.64 HCI_LE_Set_Extended_Scan_Parameters on the LE 1M PHY only (window = interval).
    case leSetExtendedScanParameters(ScanParameters)
    /// §7.8.65 HCI_LE_Set_Extended_Scan_Enable with Duration = 0 and Period = 0: scan until
    /// disabled.
    case leSetExtendedScanEnable(enable: Bool, filterDuplicates: Bool)

    /// H4 packet indicator for a command (Vol 4, Part A, §2, Table 2.1).
    public static let h4Indicator: UInt8 = 0x01

    public var opcode: HCIOpcode {
        switch self {
        case .reset: .reset
        case .setEventMask: .setEventMask
        case .readLocalVersionInformation: .readLocalVersionInformation
        case .leSetEventMask: .leSetEventMask
        case .leReadLocalSupportedFeatures: .leReadLocalSupportedFeatures
        case .leSetScanParameters: .leSetScanParameters
        case .leSetScanEnable: .leSetScanEnable
        case .leSetExtendedScanParameters: .leSetExtendedScanParameters
        case .leSetExtendedScanEnable: .leSetExtendedScanEnable
        }
    }

    /// Parameter_Total_Length.
    public var parameterLength: Int {
        switch self {
        case .reset, .readLocalVersionInformation, .leReadLocalSupportedFeatures: 0
        case .setEventMask, .leSetEventMask: 8
        // Type (1), Interval (2), Window (2), Own_Address_Type (1), Filter_Policy (1).
        case .leSetScanParameters: 7
        // Enable (1), Filter_Duplicates (1).
        case .leSetScanEnable: 2
        // Own_Address_Type (1), Filter_Policy (1), Scanning_PHYs (1), then per PHY:
        // Scan_Type (1), Scan_Interval (2), Scan_Window (2). One PHY.
        case .leSetExtendedScanParameters: 8
        // Enable (1), Filter_Duplicates (1), Duration (2), Period (2).
        case .leSetExtendedScanEnable: 6
        }
    }

    /// The bytes `encode(into:)` writes: indicator, opcode (2), length (1), parameters.
    public var encodedLength: Int { 4 &+ parameterLength }

    /// The largest command Baton encodes, for sizing a transmit buffer once.
    public static let maxEncodedLength = 4 + 8

    /// Writes the H4 frame. Throws `.noRoom` (and writes nothing) if `writer` lacks room.
    public func encode(into w: inout ByteWriter) throws(WireError) {
        try w.reserve(encodedLength)
        w.write(Self.h4Indicator)
        w.writeU16LE(opcode.rawValue)
        // Proof: parameterLength <= 8.
        w.write(UInt8(truncatingIfNeeded: parameterLength))
        switch self {
        case .reset, .readLocalVersionInformation, .leReadLocalSupportedFeatures:
            break
        case .setEventMask(let mask), .leSetEventMask(let mask):
            w.writeU64LE(mask)
        case .leSetScanParameters(let p):
            w.write(p.type.rawValue)
            w.writeU16LE(p.interval)  // LE_Scan_Interval
            w.writeU16LE(p.interval)  // LE_Scan_Window = interval: continuous, no duty cycle
            w.write(p.ownAddressType)
            w.write(p.filterPolicy)
        case .leSetScanEnable(let enable, let dup), .leSetExtendedScanEnable(let enable, let dup):
            w.write(enable ? 0x01 : 0x00)
            w.write(dup ? 0x01 : 0x00)
            if case .leSetExtendedScanEnable = self {
                w.writeU16LE(0x0000)  // Duration: 0 = scan continuously until disabled
                w.writeU16LE(0x0000)  // Period: 0 = not periodic
            }
        case .leSetExtendedScanParameters(let p):
            w.write(p.ownAddressType)
            w.write(p.filterPolicy)
            w.write(0x01)             // Scanning_PHYs: bit 0, LE 1M
            w.write(p.type.rawValue)  // Scan_Type[0]
            w.writeU16LE(p.interval)  // Scan_Interval[0]
            w.writeU16LE(p.interval)  // Scan_Window[0] = interval
        }
    }
}

// MARK: - Command Complete / Command Status

extension Malformed {
    /// A Command Complete for a real command (opcode ≠ 0x0000) without its Status return
    /// parameter (§7.7.14: every command Baton sends returns Status first).
    public static let commandCompleteWithoutStatus = Malformed("command-complete-without-status")
}

/// A parsed Command Complete (§7.7.14) or Command Status (§7.7.15) event. Return parameters
/// are borrowed as an offset range into the event.
public struct HCICommandResponse: Sendable, Equatable {
    public enum Kind: Sendable, Equatable {
        case complete  // event code 0x0E
        case status    // event code 0x0F
    }

    /// Event codes, §7.7.14 and §7.7.15.
    public static let commandCompleteCode: UInt8 = 0x0E
    public static let commandStatusCode: UInt8 = 0x0F

    public let kind: Kind
    /// Num_HCI_Command_Packets: how many commands the controller will take now (§4.4).
    public let credits: UInt8
    public let opcode: HCIOpcode
    /// The command's Status. `.success` for a NOP Command Complete, which has none.
    public let status: HCIStatus
    /// Offsets, in the event, of the return parameters after Status (empty for Command Status).
    public let returnParameters: Range<Int>

    /// Parses `event` (event code, parameter length, parameters: no H4 indicator). Returns
    /// `nil` for any other event code. Throws if the declared length does not match the bytes
    /// exactly or a fixed part is short.
    public static func parse(event: UnsafeRawBufferPointer) throws(WireError) -> HCICommandResponse? {
        var r = ByteReader(event)
        let code = try r.peekU8()
        guard code == commandCompleteCode || code == commandStatusCode else { return nil }
        var params = try eventParameters(&r)
        if code == commandCompleteCode {
            // §7.7.14: Num_HCI_Command_Packets (1), Command_Opcode (2), Return_Parameters.
            let credits = try params.readU8()
            let opcode = HCIOpcode(rawValue: try params.readU16LE())
            if opcode == .nop && params.isAtEnd {
                return HCICommandResponse(kind: .complete, credits: credits, opcode: opcode, status: .success,
                                          returnParameters: params.offset ..< params.offset)
            }
            guard !params.isAtEnd else { throw .malformed(at: params.offset, .commandCompleteWithoutStatus) }
            let status = HCIStatus(rawValue: try params.readU8())
            return HCICommandResponse(kind: .complete, credits: credits, opcode: opcode, status: status,
                                      returnParameters: params.offset ..< event.count)
        }
        // §7.7.15: Status (1), Num_HCI_Command_Packets (1), Command_Opcode (2); nothing else.
        let status = HCIStatus(rawValue: try params.readU8())
        let credits = try params.readU8()
        let opcode = HCIOpcode(rawValue: try params.readU16LE())
        try params.requireEnd()
        return HCICommandResponse(kind: .status, credits: credits, opcode: opcode, status: status,
                                  returnParameters: params.offset ..< params.offset)
    }

    /// Checks an event's header (§5.4.4: Event_Code, Parameter_Total_Length) against its bytes
    /// and returns a reader over exactly the parameters.
    static func eventParameters(_ r: inout ByteReader) throws(WireError) -> ByteReader {
        _ = try r.readU8()
        let length = Int(try r.readU8())
        let params = try r.readSubReader(length)
        try r.requireEnd()
        return params
    }
}

/// Return parameters of Read_Local_Version_Information, §7.4.1.
public struct HCILocalVersion: Sendable, Equatable {
    /// HCI_Version, Assigned Numbers §2.1: 0x06 = Core 4.0 … 0x09 = 5.0 … 0x0D = 5.4.
    public let hciVersion: UInt8
    public let hciSubversion: UInt16
    public let lmpVersion: UInt8
    /// Company_Identifier of the controller's manufacturer (Assigned Numbers §7).
    public let companyIdentifier: UInt16
    public let lmpSubversion: UInt16

    public init(hciVersion: UInt8, hciSubversion: UInt16, lmpVersion: UInt8, companyIdentifier: UInt16,
                lmpSubversion: UInt16) {
        self.hciVersion = hciVersion
        self.hciSubversion = hciSubversion
        self.lmpVersion = lmpVersion
        self.companyIdentifier = companyIdentifier
        self.lmpSubversion = lmpSubversion
    }

    /// Parses the return parameters after Status: HCI_Version (1), HCI_Subversion (2),
    /// LMP_Version (1), Company_Identifier (2), LMP_Subversion (2). Extra bytes are allowed
    /// (§7.7.14: a newer controller may append parameters).
    public static func parse(_ params: UnsafeRawBufferPointer) throws(WireError) -> HCILocalVersion {
        var r = ByteReader(params)
        try r.require(8)
        return HCILocalVersion(hciVersion: try r.readU8(), hciSubversion: try r.readU16LE(),
                               lmpVersion: try r.readU8(), companyIdentifier: try r.readU16LE(),
                               lmpSubversion: try r.readU16LE())
    }

    /// "5.4" for 0x0D; "HCI version 0x.." past what Baton knows.
    public var coreVersion: String {
        switch hciVersion {
        case 0x06: "4.0"
        case 0x07: "4.1"
        case 0x08: "4.2"
        case 0x09: "5.0"
        case 0x0A: "5.1"
        case 0x0B: "5.2"
        case 0x0C: "5.3"
        case 0x0D: "5.4"
        case 0x0E: "6.0"
        default: "HCI version \(hciVersion)"
        }
    }
}

/// LE_Features, Core 5.4, Vol 6, Part B, §4.6 (read by §7.8.3).
public struct LEFeatures: OptionSet, Sendable, Equatable {
    public let rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }

    /// Bit 8: LE 2M PHY.
    public static let le2MPHY = LEFeatures(rawValue: 1 << 8)
    /// Bit 11: LE Coded PHY.
    public static let leCodedPHY = LEFeatures(rawValue: 1 << 11)
    /// Bit 12: LE Extended Advertising, which brings the extended scanning commands
    /// (§7.8.64/§7.8.65) and the LE Extended Advertising Report.
    public static let extendedAdvertising = LEFeatures(rawValue: 1 << 12)

    /// Parses the return parameters after Status: LE_Features (8 octets, little-endian).
    public static func parse(_ params: UnsafeRawBufferPointer) throws(WireError) -> LEFeatures {
        var r = ByteReader(params)
        return LEFeatures(rawValue: try r.readU64LE())
    }
}
