// A gateway's neighbourhood: docs/rooms.md §8.3. Slots are RoomOwnership's (0 is this gateway).
import BatonLibc
import Testing
import BatonCore

private let t0 = Instant.now
private func at(_ seconds: Double) -> Instant { t0 + .milliseconds(Int((seconds * 1000).rounded())) }
private let kitchen = GatewaySlot(index: 1)
private let office = GatewaySlot(index: 2)
private let phone: UInt64 = 0x5A12_3456_789A
private let laptop: UInt64 = 0x4B00_0000_0001

@Suite("Neighbourhood (docs/rooms.md §8.3)")
struct NeighbourhoodTests {
    @Test func aGatewayThatHearsWhatWeHearBecomesANeighbourOnce() {
        var n = Neighbourhood(gateways: 4, answerCapacity: 8, forgetAfter: .seconds(60))
        #expect(n.record(from: kitchen, shared: false, now: at(0)) == nil, "a device we do not hear: not a neighbour")
        #expect(!n.isNeighbour(kitchen))
        #expect(n.record(from: kitchen, shared: true, now: at(1)) == .subscribe(kitchen))
        #expect(n.record(from: kitchen, shared: true, now: at(2)) == nil, "subscribed already")
        #expect(n.isNeighbour(kitchen))
        #expect(n.record(from: GatewaySlot(index: 0), shared: true, now: at(2)) == nil, "never our own neighbour")
    }

    /// A device walks into a room that never heard it: its first sighting goes building-wide,
    /// and each gateway that hears it answers once, in its next building batch.
    @Test func aNewcomerIsAnsweredOnceByEachGatewayThatHearsTheDevice() {
        var n = Neighbourhood(gateways: 4, answerCapacity: 8, forgetAfter: .seconds(60))
        #expect(n.buildingRecord(device: phone, from: office, shared: true, now: at(0)) == .subscribe(office))
        #expect(n.buildingRecord(device: phone, from: office, shared: true, now: at(0.1)) == nil)
        #expect(n.buildingRecord(device: laptop, from: kitchen, shared: false, now: at(0.1)) == nil, "not ours to answer")
        var owed: [UInt64] = []
        n.takeAnswers { owed.append($0) }
        #expect(owed == [phone])
        owed = []
        n.takeAnswers { owed.append($0) }
        #expect(owed.isEmpty, "answered")
    }

    @Test func aNeighbourThatSharesNothingForForgetAfterIsDropped() {
        var n = Neighbourhood(gateways: 4, answerCapacity: 8, forgetAfter: .seconds(60))
        _ = n.record(from: kitchen, shared: true, now: at(0))
        _ = n.record(from: office, shared: true, now: at(0))
        _ = n.record(from: office, shared: true, now: at(30))
        var dropped: [GatewaySlot] = []
        n.expire(now: at(59.9)) { dropped.append($0) }
        #expect(dropped.isEmpty)
        n.expire(now: at(60)) { dropped.append($0) }
        #expect(dropped == [kitchen])
        n.expire(now: at(90)) { dropped.append($0) }
        #expect(dropped == [kitchen, office])
        var left: [GatewaySlot] = []
        n.forEachNeighbour { left.append($0) }
        #expect(left.isEmpty)
        #expect(n.record(from: kitchen, shared: true, now: at(91)) == .subscribe(kitchen), "heard again: subscribed again")
    }

    /// A neighbour that shared a device within the last 10 s (a sixth of 60 s) need not have
    /// its batches looked through; a stranger, or one quiet for longer, does.
    @Test func aNeighbourThatSharedWithinTenSecondsNeedsNoLook() {
        var n = Neighbourhood(gateways: 4, answerCapacity: 8, forgetAfter: .seconds(60))
        #expect(!n.sharedRecently(kitchen, now: at(0)), "not a neighbour")
        _ = n.record(from: kitchen, shared: true, now: at(0))
        #expect(n.sharedRecently(kitchen, now: at(9.9)))
        #expect(!n.sharedRecently(kitchen, now: at(10)))
        _ = n.record(from: kitchen, shared: true, now: at(10))
        #expect(n.sharedRecently(kitchen, now: at(19.9)))
        #expect(!n.sharedRecently(office, now: at(10)))
    }

    /// Capacity + 1: an answer that does not fit is counted, not queued.
    @Test func answersPastTheCapacityAreCountedNotQueued() {
        var n = Neighbourhood(gateways: 8, answerCapacity: 2, forgetAfter: .seconds(60))
        for g in 1 ... 3 { _ = n.buildingRecord(device: UInt64(g), from: GatewaySlot(index: g), shared: true, now: at(0)) }
        var owed: [UInt64] = []
        n.takeAnswers { owed.append($0) }
        #expect(owed == [1, 2])
        #expect(n.answersDropped == 1)
    }

    @Test func aReconnectForgetsTheNeighbours() {
        var n = Neighbourhood(gateways: 4, answerCapacity: 8, forgetAfter: .seconds(60))
        _ = n.buildingRecord(device: phone, from: kitchen, shared: true, now: at(0))
        n.reset()
        #expect(!n.isNeighbour(kitchen))
        var owed: [UInt64] = []
        n.takeAnswers { owed.append($0) }
        #expect(owed.isEmpty)
        #expect(n.record(from: kitchen, shared: true, now: at(1)) == .subscribe(kitchen))
    }

    /// A neighbour that has just started hearing a device (no fresh sighting of it from that
    /// gateway) is answered too; a restarted gateway is forgotten, and answered as a stranger.
    @Test func aNewcomerNeighbourIsAnsweredAndARestartedGatewayIsAStrangerAgain() {
        var n = Neighbourhood(gateways: 4, answerCapacity: 8, forgetAfter: .seconds(60))
        #expect(n.record(from: kitchen, shared: true, now: at(0)) == .subscribe(kitchen))
        #expect(n.buildingRecord(device: phone, from: kitchen, shared: true, now: at(1)) == nil, "a neighbour already")
        n.answer(phone)
        n.answer(phone)
        var owed: [UInt64] = []
        n.takeAnswers { owed.append($0) }
        #expect(owed == [phone], "owed once")

        let forgotten = n.forget(kitchen)
        #expect(forgotten)
        #expect(!n.isNeighbour(kitchen))
        let again = n.forget(kitchen)
        #expect(!again, "not a neighbour any more")
        #expect(n.buildingRecord(device: phone, from: kitchen, shared: true, now: at(2)) == .subscribe(kitchen))
        owed = []
        n.takeAnswers { owed.append($0) }
        #expect(owed == [phone])
    }
}
