// A radio that moves like a person (docs/simulator.md): walks take time, levels change along
// the way, body shadowing is slow and fading is Rician. Measured on the player, in process.
import BatonSim
import Foundation
import Testing

private func player(_ radio: String, devices: String = "devices: [{id: 5a0000000001, at: hall}]",
                    duration: Int = 600, rate: Int = 10) throws -> ScenarioPlayer {
    ScenarioPlayer(try Scenario.parse(yaml: """
        seed: 7
        duration: \(duration)
        rate: \(rate)
        radio: {\(radio)}
        rooms: [{id: hall}, {id: kitchen}]
        \(devices)
        """, file: "s.yaml"))
}

/// Every report each room heard, as (simulated s, room, rssi).
private func reports(_ p: ScenarioPlayer, until seconds: Double) -> [(Double, Int, Int)] {
    var out: [(Double, Int, Int)] = []
    p.advance(to: Int64(seconds * 1e6), hear: { r, report in out.append((Double(report.timestamp) / 1e6, r, Int(report.rssi))) },
              event: { _ in })
    return out
}

private func mean(_ xs: [Double]) -> Double { xs.reduce(0, +) / Double(xs.count) }
private func deviation(_ xs: [Double]) -> Double {
    let m = mean(xs)
    return (xs.map { ($0 - m) * ($0 - m) }.reduce(0, +) / Double(xs.count)).squareRoot()
}

@Suite struct WalkingRadioTests {
    @Test func theKeysParseAndAreRefusedOutOfRange() throws {
        let s = try Scenario.parse(yaml: """
            duration: 1
            radio: {walk-speed: 0.3, shadowing: 3, shadowing-distance: 0.5, shadowing-time: 2.5, fading-k: 0}
            rooms: [{id: hall}]
            devices: [{id: 5a0000000001, at: hall}]
            """, file: "s.yaml")
        #expect(s.radio.walkSpeed == 0.3 && s.radio.shadowing == 3 && s.radio.shadowingDistance == 0.5
                && s.radio.shadowingTime == 2.5 && s.radio.fadingK == 0)
        let plain = try Scenario.parse(yaml: "duration: 1\nrooms: [{id: hall}]\ndevices: [{id: 5a0000000001, at: hall}]\n",
                                       file: "s.yaml")
        #expect(plain.radio.walkSpeed == 0 && plain.radio.shadowing == 0 && plain.radio.fadingK == nil,
                "off unless asked for: older scenarios play as they did")
        for bad in ["walk-speed: -1", "shadowing: 21", "shadowing-distance: 0", "shadowing-time: -1", "fading-k: 31"] {
            let error = parseError("duration: 1\nradio: {\(bad)}\nrooms: [{id: hall}]\ndevices: [{id: 5a0000000001, at: hall}]\n")
            #expect(error?.all.first?.key.hasPrefix("radio.") == true, "\(bad) was accepted")
        }
    }

    @Test func aWalkTakesTheTimeItsSpeedSaysAndTheLevelsCrossHalfWay() throws {
        // 0.25 rooms a second: hall to kitchen (one room) takes 4 s, from 10 s. No noise, so each
        // report is the mean: at 12 s the rooms hear it alike (−62.5), and the kitchen's level
        // climbs by 15 dB over the 4 s, not at once.
        let p = try player("walk-speed: 0.25, noise: 0, loss: 0", devices: """
            devices: [{id: 5a0000000001, at: hall, script: [{at: 10, walk: kitchen}]}]
            """)
        var takes: Double?
        var heard: [(Double, Int, Int)] = []
        p.advance(to: 20_000_000, hear: { r, report in heard.append((Double(report.timestamp) / 1e6, r, Int(report.rssi))) },
                  event: { e in if case .walk = e.action { takes = p.walkTakes(e.device) } })
        #expect(takes == 4)
        func level(_ room: Int, near t: Double) -> Int? {
            heard.filter { $0.1 == room }.min { abs($0.0 - t) < abs($1.0 - t) }?.2
        }
        #expect(level(1, near: 9.9) == -70 && level(0, near: 9.9) == -55)
        let midKitchen = try #require(level(1, near: 12)), midHall = try #require(level(0, near: 12))
        #expect(abs(midKitchen - midHall) <= 1, "half-way both rooms hear it alike: \(midKitchen), \(midHall)")
        #expect((-66 ... -59).contains(midKitchen))
        #expect(level(1, near: 14.1) == -55 && level(0, near: 14.1) == -70, "arrived after 4 s")
    }

    @Test func aStillDeviceKeepsItsShadowingAndAWalkingOneDoesNot() throws {
        // Shadowing 4 dB over a quarter room, no other noise. Standing still, every report of a
        // room is the same level; walking back and forth (0.25 rooms a second), the hall's
        // levels at the same spot differ from walk to walk.
        let still = try player("shadowing: 4, noise: 0, loss: 0")
        let levels = Set(reports(still, until: 60).filter { $0.1 == 0 }.map(\.2))
        #expect(levels.count == 1, "still: \(levels)")
        let walking = try player("shadowing: 4, walk-speed: 0.25, noise: 0, loss: 0", devices: """
            devices: [{id: 5a0000000001, at: hall, script: [{at: 10, walk: kitchen}, {at: 20, walk: hall},
                      {at: 30, walk: kitchen}, {at: 40, walk: hall}, {at: 50, walk: kitchen}]}]
            """)
        let atHall = reports(walking, until: 60).filter { $0.1 == 0 && (($0.0 >= 15 && $0.0 < 20) || ($0.0 >= 35 && $0.0 < 40)) }
        #expect(Set(atHall.map(\.2)).count > 1, "back in the hall after a walk, its shadowing is drawn anew in part")
    }

    @Test func fidgetingShadowingIsSlowAndOfTheGivenDeviation() throws {
        // Shadowing 4 dB changing over 2 s standing still (`shadowing-time`), no other noise: the
        // levels' deviation is about 4 dB, and reports 0.1 s apart differ by far less than
        // reports 20 s apart.
        let p = try player("shadowing: 4, shadowing-time: 2, noise: 0, loss: 0")
        let hall = reports(p, until: 600).filter { $0.1 == 0 }.map { Double($0.2) }
        #expect(abs(deviation(hall) - 4) < 0.6, "deviation \(deviation(hall))")
        let near = zip(hall, hall.dropFirst()).map { abs($0 - $1) }
        let far = zip(hall, hall.dropFirst(200)).map { abs($0 - $1) }
        #expect(mean(near) < 1.5 && mean(far) > 3, "0.1 s apart \(mean(near)) dB, 20 s apart \(mean(far)) dB")
    }

    @Test func rayleighFadingPutsOneReportInTenTenDBDown() throws {
        // K = −30 dB is all but Rayleigh: P(power < mean − 10 dB) = 1 − e^(−0.1) ≈ 9.5 %, and
        // < −20 dB ≈ 1 %; the mean power is 1 (0 dB), its mean in dB about −2.5.
        let p = try player("fading-k: -30, noise: 0, loss: 0")
        let hall = reports(p, until: 600).filter { $0.1 == 0 }.map { Double($0.2) + 55 }
        let below10 = Double(hall.filter { $0 <= -10.5 }.count) / Double(hall.count)
        let below20 = Double(hall.filter { $0 <= -20.5 }.count) / Double(hall.count)
        #expect(below10 > 0.07 && below10 < 0.12, "below −10 dB: \(below10)")
        #expect(below20 > 0.004 && below20 < 0.02, "below −20 dB: \(below20)")
        #expect(abs(mean(hall) + 2.5) < 0.5, "mean \(mean(hall)) dB")
    }
}
