// Advertising instances through BlueZ's management interface (Management.swift, mgmt-api.txt
// Add/Remove Advertising): numbered slots, each one advertisement on the air, put there and
// taken off without waiting for the kernel. Re-advertising (docs/relay.md §9) drives them from
// the gateway's loop: the gateway decides what goes in each slot (BatonGateway's
// `Readvertiser`) and pairs each slot with a listener for the phones (`ReadvertiseRadio`); this
// file is the controller's side only, and knows nothing of activities or links.
import BatonLibc
import BatonWire

/// What a loop needs of a controller's advertising slots: put slot k's advertisement on the
/// air, take it off, and hear of what the kernel refused or someone else removed.
/// `ManagementAdvertiser` is BlueZ's; tests give the gateway their own.
public protocol Advertiser: AnyObject {
    var adapter: String { get }
    /// Readable when the controller has news (`removedSlots`); -1 for none.
    var eventFD: Int32 { get }
    /// Asks for slot k's advertisement to go on the air (or be replaced): does not wait for
    /// the kernel. Throws only what is known at once; a later refusal or a missed deadline
    /// comes out of `answers`.
    func advertise(_ k: Int, _ data: [UInt8]) throws(ManagementError)
    /// Asks for slot k to leave the air, without waiting (as `advertise`).
    func withdraw(_ k: Int) throws(ManagementError)
    /// Takes everything off the air before a clean stop (may wait, bounded: the loop is over).
    func withdrawAll()
    func removedSlots(_ body: (Int) -> Void)
    /// Removals (or failures) already read with the answers, not yet handed out: the event
    /// socket will not say so again.
    var removalsPending: Bool { get }
    /// When the oldest request's answer is due at the latest: the loop wakes then for `answers`.
    var answerDeadline: Instant? { get }
    /// Reads the kernel's answers without waiting and fails the requests past their deadline:
    /// `failed` gets the slot, whether it was an advertise (else a withdraw), and why.
    func answers(now: Instant, _ failed: (_ slot: Int, _ advertise: Bool, _ error: ManagementError) -> Void)
}

extension Advertiser {
    /// A controller that answers inside `advertise`/`withdraw` (a test's) has nothing pending.
    public var answerDeadline: Instant? { nil }
    public func answers(now: Instant, _ failed: (_ slot: Int, _ advertise: Bool, _ error: ManagementError) -> Void) {}
}

/// Why a `ManagementAdvertiser` could not take its instances.
public enum AdvertiserError: Error, Sendable, Equatable {
    /// Read Advertising Features failed.
    case features(ManagementError)
    /// The controller has fewer instances than slots asked for.
    case tooFewInstances(available: UInt8, asked: Int)
    /// An instance in use at start could not be removed.
    case takingBack(instance: UInt8, ManagementError)
}

/// Advertising slots as mgmt advertising instances, on one adapter's mgmt socket. A class, so
/// its holder keeps the non-copyable socket behind a reference.
public final class ManagementAdvertiser: Advertiser {
    public let adapter: String
    var mgmt: ManagementSocket
    /// Slot k's mgmt instance: the N highest, out of bluetoothd's way (it numbers its own from 1).
    let instances: [UInt8]
    /// Instances in use at start that were removed: a killed run's, or another program's (the
    /// caller logs them).
    public let takenBack: [UInt8]

    /// Takes the `count` highest advertising instances of the socket's controller (a test's
    /// socketpair playing the kernel, or `ManagementSocket(adapter:)`). Waits for the kernel's
    /// answers (bounded): it runs before the loop does.
    public init(mgmt: consuming ManagementSocket, count: Int) throws(AdvertiserError) {
        let adapter = mgmt.adapter
        self.adapter = adapter
        let features: AdvertisingFeatures
        do throws(ManagementError) { features = try mgmt.advertisingFeatures() } catch {
            throw .features(error)
        }
        // The N highest instances, always the same ones: bluetoothd numbers its own from 1 up,
        // and instances outlive the process that added them, so what a run killed before its
        // clean stop left on the air is this program's to take back (removed below).
        guard Int(features.maxInstances) >= count else {
            throw .tooFewInstances(available: features.maxInstances, asked: count)
        }
        let instances = (0..<count).map { features.maxInstances - UInt8($0) }
        self.instances = instances
        var takenBack: [UInt8] = []
        for n in instances where features.isInUse(n) {
            do throws(ManagementError) { try mgmt.removeAdvertising(instance: n) } catch {
                throw .takingBack(instance: n, error)
            }
            takenBack.append(n)
        }
        self.mgmt = mgmt
        self.takenBack = takenBack
        failures.reserveCapacity(ManagementSocket.maxPending)
    }

    public var eventFD: Int32 { mgmt.fd }

    /// What a request was for, in its tag: slot k's tag is k × 4 + one of these.
    enum Purpose: Int { case removeBeforeAdd = 0, add = 1, withdraw = 2 }

    public func advertise(_ k: Int, _ data: [UInt8]) throws(ManagementError) {
        let now = Instant.now
        let index = mgmt.index, instance = instances[k]
        // Remove, then add: the kernel answers in order. A remove of an instance that is not
        // there is refused with Invalid Parameters, which `answers` ignores: it is gone.
        try mgmt.send(.removeAdvertising, tag: k &* 4 &+ Purpose.removeBeforeAdd.rawValue, now: now) { w throws(WireError) in
            try ManagementCommand.removeAdvertising(index: index, instance: instance, into: &w)
        }
        // Array.withUnsafeBytes rethrows untyped: the error travels out as a value.
        let result: Result<Void, ManagementError> = data.withUnsafeBytes { p in
            // Connectable: the phone opens its link on this controller's address (protocol.md §5).
            do throws(ManagementError) {
                try mgmt.send(.addAdvertising, tag: k &* 4 &+ Purpose.add.rawValue, now: now) { w throws(WireError) in
                    try ManagementCommand.addAdvertising(index: index, instance: instance, flags: .connectable,
                                                         advertisingData: p, into: &w)
                }
            } catch {
                return .failure(error)
            }
            return .success(())
        }
        try result.get()
    }

    public func withdraw(_ k: Int) throws(ManagementError) {
        let index = mgmt.index, instance = instances[k]
        try mgmt.send(.removeAdvertising, tag: k &* 4 &+ Purpose.withdraw.rawValue, now: .now) { w throws(WireError) in
            try ManagementCommand.removeAdvertising(index: index, instance: instance, into: &w)
        }
    }

    public var answerDeadline: Instant? { mgmt.nextDeadline }

    /// Failures read with the answers, kept until `answers` hands them out.
    var failures: [(slot: Int, advertise: Bool, error: ManagementError)] = []

    public func answers(now: Instant, _ failed: (_ slot: Int, _ advertise: Bool, _ error: ManagementError) -> Void) {
        read(now: now)
        for f in failures { failed(f.slot, f.advertise, f.error) }
        failures.removeAll(keepingCapacity: true)
    }

    /// Reads what the kernel queued: answers (failures kept) and removals (kept by the socket).
    func read(now: Instant) {
        mgmt.poll(now: now) { a in
            guard let error = a.error, a.tag >= 0, let purpose = Purpose(rawValue: a.tag & 3) else { return }
            // Removing what is not there is not a failure: it is gone.
            if purpose != .add, case .refused(_, _, .invalidParameters) = error { return }
            failures.append((slot: a.tag >> 2, advertise: purpose != .withdraw, error: error))
        }
    }

    /// The slots whose advertisement someone else removed (bluetoothd resets every instance
    /// when it starts): the caller puts them back (docs/relay.md §9).
    public func removedSlots(_ body: (Int) -> Void) {
        read(now: .now)
        for n in mgmt.takeRemovedInstances() { if let k = instances.firstIndex(of: n) { body(k) } }
    }

    public var removalsPending: Bool { mgmt.removedInstancesPending || !failures.isEmpty }

    /// Before a clean stop: nothing stays on the air. The loop is over, so this waits for each
    /// answer (bounded by the socket's timeout).
    public func withdrawAll() {
        for n in instances { do throws(ManagementError) { try mgmt.removeAdvertising(instance: n) } catch {} }
    }
}
