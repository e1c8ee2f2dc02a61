// The simulator's BTHome v2 sensors (docs/simulator.md "BTHome sensors"): the advertisement in
// bytes, against the examples of the BTHome format (bthome.io/format), and the scenario key that
// places one in a room.
import BatonSim
import BatonTestSupport
import Testing

@Suite struct BTHomeTests {
    /// bthome.io/format's object table: temperature `02 CA 09` is 25.06 °C (sint16, × 0.01) and
    /// humidity `03 BF 13` 50.55 % (uint16, × 0.01), after the device information byte 0x40
    /// (v2, not encrypted, regular updates) under the service UUID 0xFCD2.
    @Test func theAdvertisementIsTheFormatsExample() {
        #expect(BTHome.advertisement(temperature: 25.06, humidity: 50.55, name: nil) == hx(
            "02 01 06"  // flags: LE General Discoverable, BR/EDR not supported
            + "0a 16 d2fc 40"  // service data (10 bytes), UUID 0xFCD2, v2 unencrypted
            + "02 ca09"  // temperature 25.06 °C
            + "03 bf13"))  // humidity 50.55 %
    }

    @Test func aNegativeTemperatureIsTwosComplementAndTheNameFollows() {
        // −1.5 °C: −150 = 0xFF6A, little-endian.
        #expect(BTHome.advertisement(temperature: -1.5, humidity: nil, name: "hall") == hx("""
            020106  0716d2fc40026aff  050968616c6c
            """))
        // The longest name still fits a legacy advertisement.
        let longest = String(repeating: "x", count: BTHome.maxNameBytes)
        #expect(BTHome.advertisement(temperature: 327.67, humidity: 100, name: longest).count == 31)
        #expect(BTHome.advertisement(temperature: -327.68, humidity: nil, name: nil) == hx("020106 0716d2fc40 020080"))
    }

    @Test func aScenarioPlacesASensorThatItsRoomHears() throws {
        let s = try Scenario.load(file: scenarioFixtures.appendingPathComponent("bthome.yaml").path)
        #expect(s.bthome == [Scenario.BTHomeSensor(name: "hall-thermo", address: 0xA4C1_380B_A701, place: .room("hall"),
                                                   temperature: 21.37, humidity: 48.5)])
        var short = s
        short.duration = 10
        let player = ScenarioPlayer(short)
        var reports: [GeneratedReport] = []
        player.advance(to: player.end, hear: { _, r in if case .ordinary = r.kind { reports.append(r) } }, event: { _ in })
        // rate 2 for 10 s, less the radio's loss.
        #expect(reports.count >= 15 && reports.count <= 21, "\(reports.count)")
        for r in reports {
            #expect(r.address == 0xA4C1_380B_A701)
            #expect(r.addressType == 0)  // public: an address given in the scenario
            // 21.37 °C = 2137 = 0x0859; 48.5 % = 4850 = 0x12F2; "hall-thermo".
            #expect(r.data == hx("020106 0a16d2fc40 025908 03f212  0c09 68616c6c2d746865726d6f"))
        }
        // Without an address: random static (the top two bits 1), address type 1.
        var anonymous = short
        anonymous.bthome[0].address = nil
        var first: GeneratedReport?
        ScenarioPlayer(anonymous).advance(to: 1_000_000, hear: { _, r in
            if first == nil, case .ordinary = r.kind { first = r }
        }, event: { _ in })
        let r = try #require(first)
        #expect(r.addressType == 1 && r.address >> 46 == 0b11)
    }

    static let minimal = """
        duration: 60
        rooms: [{id: hall}]
        bthome:
          - at: hall
        """

    @Test(arguments: [
        (minimal, 4, "bthome[0]", "give temperature (°C) or humidity (%)"),
        (minimal + "\n    temperature: 400", 5, "bthome[0].temperature", "between -327.68 and 327.67"),
        (minimal + "\n    humidity: 101", 5, "bthome[0].humidity", "between 0 and 100"),
        (minimal + "\n    temperature: 20\n    name: a-very-long-thermometer", 6, "bthome[0].name", "1 to 15 bytes"),
        (minimal + "\n    temperature: 20\n    address: A4:C1:38", 6, "bthome[0].address",
         "a public address like A4:C1:38:00:00:01"),
        (minimal + "\n    temperature: 20\n    celsius: 20", 6, "bthome[0].celsius", "unknown key"),
    ])
    func aMistakeInASensorIsReported(_ yaml: String, _ line: Int, _ key: String, _ says: String) throws {
        let error = try #require(parseError(yaml), "accepted: \(yaml)")
        #expect(error.line == line, "\(error)")
        #expect(error.key == key, "\(error)")
        #expect(error.message.contains(says), "\(error)")
    }
}
