// PollLoop's sizes (docs/architecture.md "The loop"): a loop is sized once for its parts and
// their descriptors, each part states the most it polls (`LoopPart.descriptorLimit`), and a
// turn that outgrows either is counted, once a turn, so the owner can say so: the arrays grow
// then, an allocation inside the loop.
import BatonLibc
import CLibc
import Testing

/// A part that says it polls `limit` descriptors and appends `appends`.
private struct Part: LoopPart {
    var limit: Int, appends: Int
    mutating func pollDescriptors(into fds: inout [pollfd]) {
        for _ in 0 ..< appends { fds.append(pollfd(fd: -1, events: Int16(POLLIN), revents: 0)) }
    }
    var descriptorLimit: Int { limit }
    var nextDeadline: Instant? { nil }
}

@Suite("Poll loop: sizes")
struct PollLoopSizeTests {
    @Test func aLoopSizedForItsPartsCountsNothing() {
        var loop = PollLoop(parts: 3, descriptors: 4)
        var a = Part(limit: 3, appends: 3), b = Part(limit: 3, appends: 0)
        for _ in 0 ..< 3 {
            loop.begin(now: .now)
            loop.add(&a)
            loop.add(&b)
            loop.add(fd: -1)
        }
        #expect(loop.oversizedTurns == 0)
        #expect(loop.parts == 3 && loop.fds.count == 4)
    }

    @Test func aPartPollingMoreThanItSaidIsCountedOnceATurn() {
        var loop = PollLoop(parts: 2, descriptors: 8)
        var liar = Part(limit: 1, appends: 2), other = Part(limit: 1, appends: 2)
        loop.begin(now: .now)
        loop.add(&liar)
        loop.add(&other)
        #expect(loop.oversizedTurns == 1, "two parts over their own limit in one turn: one turn counted")
        liar.appends = 1
        other.appends = 1
        loop.begin(now: .now)
        loop.add(&liar)
        loop.add(&other)
        #expect(loop.oversizedTurns == 1, "a turn within the limits adds nothing")
    }

    @Test func morePartsOrDescriptorsThanTheLoopWasSizedForAreCounted() {
        var loop = PollLoop(parts: 2, descriptors: 2)
        loop.begin(now: .now)
        loop.add(fd: -1)
        loop.add(fd: -1)
        loop.add(deadline: nil)
        #expect(loop.oversizedTurns == 1, "a third part in a loop sized for two")
        var wide = Part(limit: 3, appends: 3)
        loop.begin(now: .now)
        loop.add(&wide)
        #expect(loop.oversizedTurns == 2, "three descriptors in a loop sized for two, though the part said three")
    }
}
