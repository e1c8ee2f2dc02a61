// Radio sources behind one protocol: where HCI events come from.
//
//   RadioH4       H4 over a file descriptor: a serial controller with HCI-UART firmware, or a
//                 socket to the simulator's virtual controller. Baton owns the controller:
//                 Reset, event masks, scan parameters, scan enable.
//   RadioBlueZ    the BlueZ raw HCI socket. The kernel owns the controller (it sent Reset and
//                 the event masks when it brought the adapter up); Baton only sets scanning.
//   (capture)     replay of a btsnoop/pcap capture, as fast as possible or paced by the
//                 capture's timestamps. Built on the capture reader (Capture.swift): it has no
//                 descriptor (`fd == -1`), reports the next record's due time as
//                 `nextDeadline` (now, when unpaced), delivers due records from `poll`, has no
//                 init sequence (`start` only rewinds), and ends in `.finished`.
//
// Every source is driven by the caller's single poll() loop (docs/architecture.md §2): no
// threads, no blocking waits. The loop polls `fd` for POLLIN (plus POLLOUT while
// `wantsWrite`), with a timeout up to `nextDeadline`, and calls `poll(now:_:)` whenever the fd
// is ready or the deadline has passed. Timeouts are deadlines, checked inside `poll`.

import BatonLibc
public import BatonWire

/// A source of raw HCI event packets: event code, parameter length, parameters; no H4
/// indicator. LE Meta events (0x3E) carry the advertising reports; `HCIEvent` decodes them.
public protocol RadioSource: ~Copyable {
    /// The descriptor for the caller's poll(), or -1 for a source driven by deadlines alone
    /// (capture replay); poll() ignores negative descriptors.
    var fd: Int32 { get }
    /// Ask poll() for POLLOUT as well: a command is waiting for the descriptor to take it.
    var wantsWrite: Bool { get }
    var state: RadioState { get }
    /// When `poll(now:_:)` must run even if `fd` stays quiet (a command timeout, the next
    /// paced capture record); `nil` when nothing is pending.
    var nextDeadline: Instant? { get }

    /// Starts the init sequence, or restarts it from the top: the watchdog re-initialises a
    /// controller that went silent, and a failed init is retried the same way. Does not wait.
    mutating func start(now: Instant) throws(RadioError)

    /// Does what is ready without blocking: sends the next command when flow control allows,
    /// reads what arrived, answers the init sequence, checks the deadline. Every event the
    /// source does not consume itself (everything except Command Complete / Command Status)
    /// goes to `onEvent`, borrowed for the duration of the call. Returns how many it delivered.
    /// A thrown error leaves the source in `.stopped`; `start(now:)` recovers.
    mutating func poll(now: Instant,
                       _ onEvent: (UnsafeRawBufferPointer) -> Void) throws(RadioError) -> Int

    /// For a finite source: where its input stopped being readable (a capture cut off by a
    /// power loss), if it did. What came before was delivered.
    var damage: WireError? { get }

    /// The scan type the controller accepted last (LE_Scan_Type, §7.8.10); nil while none is
    /// known (before the init sets it, after an error) and for sources with no controller.
    var scanType: ScanType? { get }

    /// Asks for passive or active scanning from now on (docs/esphome.md "Active scanning"). A
    /// scanning controller is changed at once (disable, parameters, enable); otherwise the
    /// next init uses it. Does not wait.
    mutating func setScanType(_ type: ScanType, now: Instant) throws(RadioError)
}

extension RadioSource where Self: ~Copyable {
    public var damage: WireError? { nil }
    /// A source with no controller (a capture replay) scans as it was captured.
    public var scanType: ScanType? { nil }
    public mutating func setScanType(_ type: ScanType, now: Instant) throws(RadioError) {}
}

public enum RadioState: Sendable, Equatable {
    /// Not started, or stopped by an error (which `poll`/`start` threw). Events still flow.
    case stopped
    /// The init sequence is running.
    case initialising
    /// Init done: the controller is scanning and LE Meta events flow.
    case scanning
    /// A finite source (capture replay) delivered everything.
    case finished
}

/// Which scanning commands to use. Core 5.4, Vol 4, Part E, §3.1.1: a controller refuses
/// (Command Disallowed) legacy advertising/scanning commands once extended ones were used, and
/// the reverse, so one mode is chosen per init and kept.
public enum ScanMode: Sendable, Equatable {
    /// Extended scanning (§7.8.64/§7.8.65) when LE_Read_Local_Supported_Features reports
    /// LE Extended Advertising (Vol 6, Part B, §4.6, bit 12), legacy (§7.8.10/§7.8.11) otherwise.
    case automatic
    case legacy
    case extended
}

/// How a source sets up its controller.
public struct RadioConfig: Sendable, Equatable {
    public var scan: ScanParameters
    public var mode: ScanMode
    /// How long a command may stay unanswered, and how long the controller may withhold
    /// command credits, before it counts as silent. Linux waits 2 s (HCI_CMD_TIMEOUT).
    public var commandTimeout: Duration
    /// Set_Event_Mask (§7.3.1), sent only by sources that own the controller.
    public var eventMask: UInt64

    public init(scan: ScanParameters = .default, mode: ScanMode = .automatic,
                commandTimeout: Duration = .seconds(2), eventMask: UInt64 = EventMask.scanner) {
        self.scan = scan
        self.mode = mode
        self.commandTimeout = commandTimeout
        self.eventMask = eventMask
    }
}

/// Why a radio source cannot deliver events. The description is what the user reads.
public enum RadioError: Error, Sendable, Equatable, CustomStringConvertible {
    /// `socket(AF_BLUETOOTH, …)` failed with EAFNOSUPPORT: no Bluetooth in this kernel.
    case noBluetoothSupport
    /// No adapter by that name (e.g. "hci99").
    case adapterNotFound(String)
    /// The adapter went down or was removed while open (ENETDOWN, ENODEV, EPIPE).
    case adapterDown(String)
    /// rfkill blocks the adapter (ERFKILL when bringing it up).
    case adapterBlocked(String)
    /// The process lacks a capability; the text names which and how to grant it.
    case permissionDenied(String)
    /// The H4 peer closed the stream (read returned 0).
    case closed
    /// The controller refused a command, did not answer, or reported a hardware error.
    case controller(ControllerError)
    /// The controller sent bytes that do not parse (a malformed Command Complete, say).
    case wire(WireError)
    /// Any other OS error.
    case os(Errno)
    /// A setting the controller would reject; the text names it.
    case invalidConfiguration(String)

    public var description: String {
        switch self {
        case .noBluetoothSupport:
            "this kernel has no Bluetooth support, or a sandbox denies it (AF_BLUETOOTH unavailable; a systemd unit needs AF_BLUETOOTH in RestrictAddressFamilies=): run on a machine with BlueZ, or give another radio source: radio.source in the config or --radio (capture:FILE replays a btsnoop or pcap capture, h4:/dev/ttyACM0 a serial controller; docs/config.md)"
        case .adapterNotFound(let name):
            "no Bluetooth adapter named \(name) (`btmgmt info` or `bluetoothctl list` shows the adapters this machine has)"
        case .adapterDown(let name):
            "Bluetooth adapter \(name) went down or was removed"
        case .adapterBlocked(let name):
            "Bluetooth adapter \(name) is blocked by rfkill (`rfkill unblock bluetooth`)"
        case .permissionDenied(let why):
            why
        case .closed:
            "the controller closed the H4 connection"
        case .controller(let e):
            e.description
        case .wire(let e):
            "the controller sent a malformed packet: \(e)"
        case .os(let e):
            e.description
        case .invalidConfiguration(let why):
            "invalid radio configuration: \(why)"
        }
    }
}

// MARK: - The init sequence with command flow control (shared by RadioH4 and RadioBlueZ)

/// The init sequence as a state machine driven by events: which command comes next, whether
/// flow control lets it go, what its answer means. It does no I/O; the sources move the bytes.
///
/// Flow control, Core 5.4, Vol 4, Part E, §4.4: the host may send as many commands as the last
/// Num_HCI_Command_Packets allowed, and after power-on or Reset assumes 1. On top of that this
/// machine keeps one command outstanding: the next goes only after the previous one's Command
/// Complete/Status (each step depends on the one before, e.g. the scan mode on the features).
struct CommandFlow: Sendable {
    enum Step: UInt8, Sendable {
        case reset, readLocalVersion, readLEFeatures, setEventMask, leSetEventMask
        case scanDisable, scanParameters, scanEnable
    }

    enum Phase: Sendable, Equatable { case idle, running, done, failed }

    /// Sources that own the controller (H4) reset it and set its event masks; under BlueZ the
    /// kernel did both, and a raw Reset would leave the kernel's view of the controller stale.
    let ownsController: Bool
    /// The configuration; its scan type is the one wanted now (`setScanType`).
    private(set) var config: RadioConfig
    /// The scan type the controller last accepted in its scan parameters; nil before that, and
    /// after a failure (the controller's state is then unknown).
    private(set) var appliedScanType: ScanType? = nil
    /// The type in the scan parameters sent and not yet answered.
    private var sentScanType: ScanType = .passive

    private(set) var phase: Phase = .idle
    private var plan = InlineArray<8, Step>(repeating: .reset)
    private var planCount = 0
    private var index = 0
    /// The command sent and not yet answered.
    private(set) var outstanding: HCIOpcode? = nil
    /// Commands the controller will take now (§4.4).
    private(set) var credits = 1
    private(set) var deadline: Instant? = nil
    private(set) var localVersion: HCILocalVersion? = nil
    private(set) var leFeatures: LEFeatures? = nil
    private(set) var usesExtendedScanning = false
    /// Commands sent since `start` (for logs).
    private(set) var commandsSent = 0

    init(config: RadioConfig, ownsController: Bool) {
        self.config = config
        self.ownsController = ownsController
    }

    /// (Re)starts from the first step. Credits go back to 1 (§4.4: assumed after Reset; after a
    /// timeout the old count means nothing), and an unanswered command is forgotten: if its
    /// answer still arrives, its opcode will not match and only its credits are used.
    mutating func start(now: Instant) {
        planCount = 0
        func add(_ s: Step) { plan[planCount] = s; planCount &+= 1 }
        if ownsController { add(.reset) }
        add(.readLocalVersion)
        add(.readLEFeatures)
        if ownsController {
            add(.setEventMask)
            add(.leSetEventMask)
        } else {
            // The kernel may be scanning for bluetoothd; scan parameters are refused while
            // scanning (§7.8.10: Command Disallowed), so stop it first.
            add(.scanDisable)
        }
        add(.scanParameters)
        add(.scanEnable)
        index = 0
        outstanding = nil
        credits = 1
        deadline = nil
        localVersion = nil
        leFeatures = nil
        usesExtendedScanning = config.mode == .extended
        appliedScanType = nil
        commandsSent = 0
        phase = .running
    }

    /// Asks for `type` (Home Assistant's active window, docs/esphome.md "Active scanning").
    /// §7.8.10 and §7.8.64 refuse new parameters while scanning (Command Disallowed), so a
    /// controller that is scanning gets the three commands that change it: disable, parameters,
    /// enable. Version and features stay as the init read them; nothing is reset. During an
    /// init the new type goes into its parameters if they are not sent yet, or into a change
    /// that follows it; a stopped flow takes it at its next start.
    mutating func setScanType(_ type: ScanType, now: Instant) {
        guard type != config.scan.type else {
            // Back to what the controller has (or is about to get): nothing to change.
            return
        }
        config.scan = config.scan.with(type: type)
        if phase == .done { beginScanChange(now: now) }
    }

    /// The plan that changes the scan parameters of a scanning controller.
    private mutating func beginScanChange(now: Instant) {
        plan[0] = .scanDisable
        plan[1] = .scanParameters
        plan[2] = .scanEnable
        planCount = 3
        index = 0
        outstanding = nil
        deadline = creditDeadline(now: now)
        phase = .running
    }

    /// Marks the sequence failed (the source threw); `start` recovers.
    mutating func fail() {
        phase = .failed
        deadline = nil
        outstanding = nil
        appliedScanType = nil
    }

    /// The command to send now, if any: the sequence is running, nothing is outstanding, and
    /// the controller granted a credit. Taking it spends the credit and starts its timeout.
    mutating func nextCommand(now: Instant) -> HCICommand? {
        guard phase == .running, outstanding == nil, index < planCount, credits > 0 else { return nil }
        let command = command(for: plan[index])
        if plan[index] == .scanParameters { sentScanType = config.scan.type }
        outstanding = command.opcode
        credits &-= 1
        commandsSent &+= 1
        deadline = now + config.commandTimeout
        return command
    }

    private func command(for step: Step) -> HCICommand {
        let ext = usesExtendedScanning
        switch step {
        case .reset: return .reset
        case .readLocalVersion: return .readLocalVersionInformation
        case .readLEFeatures: return .leReadLocalSupportedFeatures
        case .setEventMask: return .setEventMask(config.eventMask)
        case .leSetEventMask:
            // Only the report the chosen mode produces: an older controller may reject bits
            // it has no event for (the kernel sets bit 12 only with extended scanning, too).
            return .leSetEventMask(ext ? EventMask.leAdvertisingReport | EventMask.leExtendedAdvertisingReport
                                       : EventMask.leAdvertisingReport)
        case .scanDisable:
            return ext ? .leSetExtendedScanEnable(enable: false, filterDuplicates: false)
                       : .leSetScanEnable(enable: false, filterDuplicates: false)
        case .scanParameters:
            return ext ? .leSetExtendedScanParameters(config.scan) : .leSetScanParameters(config.scan)
        case .scanEnable:
            // Filter_Duplicates off: every advertisement is a fresh RSSI sample, and a changed
            // beacon sequence must not be dropped as a duplicate.
            return ext ? .leSetExtendedScanEnable(enable: true, filterDuplicates: false)
                       : .leSetScanEnable(enable: true, filterDuplicates: false)
        }
    }

    /// The step whose command is outstanding (valid while `outstanding != nil`).
    private var currentStep: Step { plan[index] }

    /// Takes an event (no H4 indicator). Returns true if it was for this machine (Command
    /// Complete/Status, Hardware Error) and must not go to the caller.
    mutating func handle(event: UnsafeRawBufferPointer, now: Instant) throws(RadioError) -> Bool {
        guard event.count >= 1 else { return false }
        let code = event[0]
        if code == Self.hardwareErrorCode {
            // §7.7.16: Hardware_Code (1). The controller needs a Reset.
            var r = ByteReader(event)
            let hwCode: UInt8
            do throws(WireError) {
                var params = try HCICommandResponse.eventParameters(&r)
                hwCode = try params.readU8()
            } catch {
                throw .wire(error)
            }
            // Whatever the phase, the controller now needs a Reset: stop until `start`.
            fail()
            throw .controller(.hardwareError(code: hwCode))
        }
        let parsed: HCICommandResponse?
        do throws(WireError) {
            parsed = try HCICommandResponse.parse(event: event)
        } catch {
            throw .wire(error)
        }
        guard let response = parsed else { return false }
        credits = Int(response.credits)
        guard phase == .running else { return true }
        guard let opcode = outstanding, response.opcode == opcode else {
            // A NOP, a late answer to a command forgotten by `start`, or (under BlueZ) an answer
            // to the kernel's own command: only its credits count.
            if outstanding == nil { deadline = creditDeadline(now: now) }
            return true
        }
        let step = currentStep
        outstanding = nil
        if response.status != .success {
            // Disabling a scan that is not running may be refused with Command Disallowed by
            // pre-5.0 controllers; the goal (not scanning) holds either way.
            let tolerated = step == .scanDisable && response.status == .commandDisallowed
            if !tolerated {
                fail()
                throw .controller(.commandFailed(opcode, response.status))
            }
        } else if response.kind == .complete {
            let params = UnsafeRawBufferPointer(rebasing: event[response.returnParameters])
            do throws(WireError) {
                switch step {
                case .readLocalVersion:
                    localVersion = try HCILocalVersion.parse(params)
                case .readLEFeatures:
                    let features = try LEFeatures.parse(params)
                    leFeatures = features
                    if config.mode == .automatic {
                        usesExtendedScanning = features.contains(.extendedAdvertising)
                    }
                default:
                    break
                }
            } catch {
                fail()
                throw .wire(error)
            }
        }
        if step == .scanParameters { appliedScanType = sentScanType }
        // A Command Status with success for a command that completes with Command Complete is
        // off-spec (§7.7.15); it is taken as done, with no return parameters: unknown features
        // mean legacy scanning, which every LE controller has.
        index &+= 1
        if index == planCount {
            phase = .done
            deadline = nil
            // A type asked for after these parameters went out (an init, or a change, in flight).
            if appliedScanType != config.scan.type { beginScanChange(now: now) }
        } else {
            deadline = creditDeadline(now: now)
        }
        return true
    }

    /// With nothing outstanding: no deadline while a credit is available (the next command
    /// goes now), else the time by which the controller must grant one.
    private func creditDeadline(now: Instant) -> Instant? {
        guard phase == .running, index < planCount else { return nil }
        return credits > 0 ? nil : now + config.commandTimeout
    }

    /// Throws if the deadline passed: a command unanswered, or no credit granted.
    mutating func checkDeadline(now: Instant) throws(RadioError) {
        guard phase == .running, let d = deadline, now >= d else { return }
        let error: ControllerError
        if let opcode = outstanding {
            error = .commandTimeout(opcode, after: config.commandTimeout)
        } else {
            error = .noCommandCredit(command(for: plan[index]).opcode, after: config.commandTimeout)
        }
        fail()
        throw .controller(error)
    }

    var state: RadioState {
        switch phase {
        case .idle, .failed: .stopped
        case .running: .initialising
        case .done: .scanning
        }
    }

    /// §7.7.16 Hardware Error event.
    static let hardwareErrorCode: UInt8 = 0x10
}
