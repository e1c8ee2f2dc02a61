// The test support's children (ChildProcess): every broker, mosquitto_sub and `baton` a test
// starts. Tests run in parallel in one process, so what a child inherits is another test's.
import BatonTestSupport
import Foundation
import Glibc
import Testing

@Suite struct ChildProcessTests {
    /// A socket the test process holds without close-on-exec is not the child's: were it
    /// inherited, the test's close() would leave the connection open as long as the child
    /// lives (a client that left would still count at the server).
    @Test func aChildHoldsOnlyStdinStdoutAndStderr() throws {
        let held = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(held > 2)
        defer { close(held) }
        let out = FileManager.default.temporaryDirectory.appendingPathComponent("baton-child-\(getpid())-fds").path
        defer { unlink(out) }
        // The shell lists its own descriptors: what it was given, as the program it execs would be.
        let child = try ChildProcess("/bin/sh", ["-c", "for f in /proc/$$/fd/*; do echo ${f##*/}; done"], stdout: out)
        #expect(child.wait(timeout: .seconds(10)) == 0)
        let fds = Set(((try? String(contentsOfFile: out, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init))
        #expect(fds.isSuperset(of: ["0", "1", "2"]), "listed: \(fds.sorted())")
        #expect(!fds.contains(String(held)), "the child inherited the test's socket \(held): \(fds.sorted())")
    }

    /// The same for Foundation's Process, which starts the gateways under test (GatewayProcess).
    @Test func aFoundationProcessHoldsOnlyStdinStdoutAndStderr() throws {
        let held = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        try #require(held > 2)
        defer { close(held) }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/bin/sh")
        p.arguments = ["-c", "for f in /proc/$$/fd/*; do echo ${f##*/}; done"]
        let pipe = Pipe()
        p.standardOutput = pipe
        try p.run()
        let listed = pipe.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let fds = Set(String(decoding: listed, as: UTF8.self).split(separator: "\n").map(String.init))
        #expect(fds.isSuperset(of: ["0", "1", "2"]), "listed: \(fds.sorted())")
        #expect(!fds.contains(String(held)), "the child inherited the test's socket \(held): \(fds.sorted())")
    }
}
