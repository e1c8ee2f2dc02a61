// The capture generator (docs/simulator.md, `baton sim capture`), in process: the bundled
// demo capture is its output. What `baton replay` reads out of its captures, and what tshark
// counts in them, are BatonCLITests' (ReplayTests.swift).
import BatonSim
import BatonTestSupport
import Foundation
import Testing

@Suite struct CaptureGeneratorTests {
    @Test func theBundledDemoCaptureIsTheGeneratorsOutput() throws {
        // README's first command replays this file; it must stay what `baton sim capture` writes.
        var g = CaptureGenerator(devices: 12, seed: 1)
        let (file, _) = g.capture(reports: 200, invalidateAtEnd: true)
        let bundled = try Data(contentsOf: repository.appendingPathComponent("Tests/Fixtures/generated-demo.btsnoop"))
        #expect(Array(bundled) == file, "regenerate with: baton sim capture Tests/Fixtures/generated-demo.btsnoop --devices 12 --reports 200 --seed 1 --invalidate")
    }
}
