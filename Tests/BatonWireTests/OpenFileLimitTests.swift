// poll(2) refuses more entries than the soft open-file limit (EINVAL, poll(2) ERRORS), idle
// entries (fd −1) included: a gateway whose relay capacities reserve more than systemd's soft
// limit of 1024 would wake for nothing every turn. `OpenFileLimit.ensure` raises the soft limit
// at start, up to the hard one (docs/config.md "Relay").
import BatonLibc
import CLibc
import Testing

@Suite("Open-file limit", .serialized)
struct OpenFileLimitTests {
    @Test func aLoopOfMoreEntriesThanTheSoftLimitFailsUntilTheLimitIsRaised() throws {
        let before = try #require(OpenFileLimit.current())
        defer { OpenFileLimit.setSoft(before.soft) }
        let soft = min(before.soft, 1024)
        try #require(before.hard >= soft + 64, "the hard limit leaves room to raise")
        #expect(OpenFileLimit.setSoft(soft))
        let entries = soft + 16

        var loop = PollLoop(parts: entries + 1, descriptors: entries)
        func turn() {
            loop.begin(now: .now)
            for _ in 0 ..< entries { _ = loop.add(fd: -1) }
            _ = loop.add(deadline: .now)
            loop.wait()
        }
        turn()
        #expect(loop.failedWaits == 1)
        #expect(loop.lastFailure == EINVAL)

        #expect(OpenFileLimit.ensure(entries + 8) == .raised(from: soft, to: entries + 8))
        #expect(OpenFileLimit.current()?.soft == entries + 8)
        turn()
        #expect(loop.failedWaits == 1, "the same loop polls once the limit allows it")
        #expect(loop.turns == 2)
    }

    @Test func aLimitThatAllowsEnoughIsLeftAndOneBeyondTheHardLimitIsShort() throws {
        let now = try #require(OpenFileLimit.current())
        #expect(OpenFileLimit.ensure(now.soft) == .enough(soft: now.soft))
        if now.hard < Int.max {
            #expect(OpenFileLimit.ensure(now.hard + 1) == .short(hard: now.hard))
            #expect(OpenFileLimit.current()?.soft == now.soft, "a short limit is not touched")
        }
    }
}
