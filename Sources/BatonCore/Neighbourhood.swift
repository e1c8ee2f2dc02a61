// A gateway's neighbourhood (docs/rooms.md §8.3): the gateways whose batches it must receive,
// learned from what they and it hear. A gateway is a neighbour while it has, within
// `forgetAfter`, sent a record (as heard) of a device this gateway also hears or owns; a
// building-wide record from a gateway that is not a neighbour yet is answered with this
// gateway's own sighting of that device in its next building batch, so the newcomer learns
// this gateway too.
//
// The type decides; the loop subscribes (`<prefix>/rooms/<gateway>`), unsubscribes and sends
// the answers. Slots are RoomOwnership's gateway slots. Storage is fixed at init; nothing
// here allocates after it.
import BatonLibc

public enum NeighbourChange: Sendable, Equatable {
    /// Start receiving this gateway's batches.
    case subscribe(GatewaySlot)
}

public struct Neighbourhood {
    public let forgetAfter: Duration
    /// Answers owed that did not fit `answerCapacity` (counted, not queued: the newcomer's
    /// next building record, or a later answer, makes up for it).
    public private(set) var answersDropped = 0

    // Internal, not private: see ActivityTable.Entry (a Swift 6.3.1 IRGen failure).
    struct Slot {
        var neighbour = false
        var lastShared: Instant?
    }
    private var slots: [Slot]
    private var answers: [UInt64]
    private let answerCapacity: Int

    /// `gateways`: RoomOwnership's registry size (slot 0 is this gateway, never a neighbour of
    /// itself: it always reads its own batches). `answerCapacity`: devices one building batch
    /// may answer for.
    public init(gateways: Int, answerCapacity: Int, forgetAfter: Duration) {
        precondition(gateways >= 1 && answerCapacity >= 1, "a neighbourhood needs room for one gateway and one answer")
        self.forgetAfter = forgetAfter
        slots = Array(repeating: Slot(), count: gateways)
        answers = []
        answers.reserveCapacity(answerCapacity)
        self.answerCapacity = answerCapacity
    }

    public func isNeighbour(_ g: GatewaySlot) -> Bool { g.index > 0 && g.index < slots.count && slots[g.index].neighbour }

    /// Whether `g` is a neighbour that shared a device less than a sixth of `forgetAfter` ago
    /// (10 s at the defaults): another shared record from it would only move that instant on,
    /// so its neighbourhood batch need not be looked through. It is then forgotten up to that
    /// much sooner, after 50 s rather than 60 s without sharing.
    public func sharedRecently(_ g: GatewaySlot, now: Instant) -> Bool {
        guard isNeighbour(g), let t = slots[g.index].lastShared else { return false }
        return now - t < forgetAfter / 6
    }

    /// Neighbours now, in slot order.
    public func forEachNeighbour(_ body: (GatewaySlot) -> Void) {
        for i in slots.indices where slots[i].neighbour { body(GatewaySlot(index: i)) }
    }

    /// A record from `from`'s neighbourhood batch that heard a device; `shared`: this gateway
    /// hears or owns that device too. Returns `.subscribe` when `from` becomes a neighbour.
    public mutating func record(from: GatewaySlot, shared: Bool, now: Instant) -> NeighbourChange? {
        guard shared, from.index > 0, from.index < slots.count else { return nil }
        slots[from.index].lastShared = now
        guard !slots[from.index].neighbour else { return nil }
        slots[from.index].neighbour = true
        return .subscribe(from)
    }

    /// A record of `device` from `from`'s building-wide batch that heard it. As `record`, and
    /// when `from` was not a neighbour yet and the device is shared, this gateway owes an
    /// answer: its own sighting of `device` in its next building batch (`takeAnswers`).
    public mutating func buildingRecord(device: UInt64, from: GatewaySlot, shared: Bool,
                                        now: Instant) -> NeighbourChange? {
        let change = record(from: from, shared: shared, now: now)
        if change != nil { owe(device) }
        return change
    }

    /// A building-wide record of `device` from a gateway that is a neighbour already, but whose
    /// sightings of that device this gateway did not hold fresh: it has just started hearing
    /// it (a newcomer), and need not hold ours, since neighbourhoods are learned on each side
    /// apart (one side may have forgotten or restarted). Owes it the answer a stranger gets.
    /// An answer never earns an answer back: its sender's sightings are fresh by then.
    public mutating func answer(_ device: UInt64) { owe(device) }

    /// A gateway that (re)started: it knows no neighbours now, so it is nobody's until its
    /// next shared record, which then gets the answer a stranger gets. True when it was a
    /// neighbour (the loop unsubscribes).
    public mutating func forget(_ g: GatewaySlot) -> Bool {
        guard isNeighbour(g) else { return false }
        slots[g.index] = Slot()
        return true
    }

    /// The devices owed as answers, each once, in the order owed; then none.
    public mutating func takeAnswers(_ body: (UInt64) -> Void) {
        for d in answers { body(d) }
        answers.removeAll(keepingCapacity: true)
    }

    /// Neighbours that shared nothing for `forgetAfter` stop being neighbours: `body` gets each,
    /// to unsubscribe from its batches.
    public mutating func expire(now: Instant, _ body: (GatewaySlot) -> Void) {
        for i in slots.indices where slots[i].neighbour {
            guard let t = slots[i].lastShared, now - t < forgetAfter else {
                slots[i] = Slot()
                body(GatewaySlot(index: i))
                continue
            }
        }
    }

    /// Reconnected (docs/rooms.md §7): subscriptions are gone, so are the neighbours; the first
    /// building batch (everything heard is new) finds them again.
    public mutating func reset() {
        for i in slots.indices { slots[i] = Slot() }
        answers.removeAll(keepingCapacity: true)
    }

    private mutating func owe(_ device: UInt64) {
        for d in answers where d == device { return }
        guard answers.count < answerCapacity else {
            answersDropped &+= 1
            return
        }
        answers.append(device)
    }
}
