// PollLoop's gathering (docs/architecture.md §2 "Gathering"): what becomes ready while a turn
// gathers is served in one turn, and a deadline inside the gathering is not delayed.
import BatonLibc
import CLibc
import Foundation
import Testing

@Suite("Poll loop: gathering")
struct PollLoopGatherTests {
    @Test func reportsThatArriveWhileATurnGathersAreServedInOneTurn() throws {
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        var loop = PollLoop(parts: 1, descriptors: 1)
        loop.gather = 300_000_000  // 300 ms, far longer than the five writes take
        // The first turn: one byte.
        #expect(write(fds[1], "a", 1) == 1)
        loop.begin(now: .now)
        let part = loop.add(fd: fds[0])
        loop.wait()
        let ready = loop.isReady(part)
        #expect(ready)
        var buffer = [UInt8](repeating: 0, count: 64)
        #expect(read(fds[0], &buffer, 64) == 1)
        // Five more bytes, 10 ms apart, from another thread: the next turn gathers them all.
        let writer = fds[1]
        let thread = Thread {
            for _ in 0 ..< 5 { _ = write(writer, "b", 1); usleep(10_000) }
        }
        thread.start()
        loop.begin(now: .now)
        let again = loop.add(fd: fds[0])
        loop.wait()
        let readyAgain = loop.isReady(again), turns = loop.turns
        #expect(readyAgain)
        #expect(read(fds[0], &buffer, 64) == 5, "one turn read what five writes delivered")
        #expect(turns == 2)
    }

    @Test func aDeadlineInsideTheGatheringIsNotDelayed() {
        var loop = PollLoop(parts: 1, descriptors: 0)
        loop.gather = 60_000_000_000  // a minute
        loop.begin(now: .now)
        loop.wait()  // the first turn sets when the gathering began
        let start = Instant.now
        loop.begin(now: start)
        let timer = loop.add(deadline: start + .milliseconds(20))
        let now = loop.wait()
        let due = loop.isDue(timer)
        #expect(due)
        #expect(now - start < .seconds(30), "woken at the deadline, not after the minute of gathering")
    }
}
