// The `esphome:` section (docs/config.md "esphome", docs/esphome.md §6): off unless present,
// encrypted unless it says `encryption: none`.
import Testing
import BatonProxy
@testable import BatonGateway

private func load(_ yaml: String) throws(ConfigError) -> GatewayConfig {
    try GatewayConfig.parse(yaml: yaml, file: "/etc/baton/baton.yaml", hostName: "hall")
}

private func problem(_ yaml: String) -> String? {
    do throws(ConfigError) { _ = try load(yaml); return nil } catch { return error.description }
}

private let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

@Suite struct ESPHomeConfigTests {
    @Test func offWithoutTheSection() throws {
        #expect(try load("").esphome == nil)
    }

    @Test func onWithAKeyAndTheDefaults() throws {
        let s = try #require(try load("esphome:\n  encryption-key: \(key)\n").esphome)
        #expect(s.encryption == .noise(key: Array(0...31)))
        #expect(s.address == "0.0.0.0" && s.port == 6053 && s.clients == 4)
        #expect(s.name.isEmpty && s.friendlyName.isEmpty && s.mac == nil)
        #expect(s.mdnsServiceFile == "/etc/avahi/services/baton-esphome.service")
        let id = ProxyIdentity(settings: s, gatewayID: "hall", room: "Hall")
        #expect(id.name == "hall" && id.friendlyName == "Hall")
        #expect(String(decoding: id.info.macAddress, as: UTF8.self) == ProxySettings.macText(ProxySettings.derivedMAC(gatewayID: "hall")))
        #expect(id.mac >> 40 == 0x02, "locally administered, unicast")
    }

    @Test func plaintextOnlyWhenSaid() throws {
        let s = try #require(try load("esphome:\n  encryption: none\n  address: 127.0.0.1\n  port: 16053\n").esphome)
        #expect(s.encryption == .none && s.address == "127.0.0.1" && s.port == 16053)
        #expect(problem("esphome:\n  port: 6053\n")
                == "/etc/baton/baton.yaml:1: esphome: needs encryption-key (32 bytes in base64, which Home Assistant asks for) or, to serve it unencrypted, encryption: none")
        // An empty section is absent, as every empty key is (docs/config.md "Format"): off.
        #expect(try load("esphome:\n").esphome == nil)
        #expect(problem("esphome:\n  encryption-key: \(key)\n  encryption: none\n")
                == "/etc/baton/baton.yaml:3: esphome.encryption: give esphome.encryption-key or esphome.encryption: none, not both")
        #expect(problem("esphome:\n  encryption: noise\n")?.contains("esphome.encryption: expected") == true)
    }

    @Test func aBadKeyOrAddressNamesItsLine() {
        #expect(problem("esphome:\n  encryption-key: AAECAwQF\n")
                == "/etc/baton/baton.yaml:2: esphome.encryption-key: expected 32 bytes in base64 (44 characters ending in \"=\", as `openssl rand -base64 32` writes), got 8 characters")
        #expect(problem("esphome:\n  encryption: none\n  address: hall.lan\n")?
                    .hasPrefix("/etc/baton/baton.yaml:3: esphome.address: expected an IPv4 or IPv6 address") == true)
        #expect(problem("esphome:\n  encryption: none\n  clients: 17\n")?.contains("esphome.clients: must be between 1 and 16") == true)
        #expect(problem("esphome:\n  encryption: none\n  mac: 02:BA:70\n")?.contains("esphome.mac: expected a MAC address") == true)
    }

    @Test func theMACAndNamesCanBeSet() throws {
        let s = try #require(try load("esphome:\n  encryption: none\n  name: hall-pi\n  friendly-name: The hall\n  mac: 02:ba:70:12:34:56\n  mdns-service-file: \"\"\n").esphome)
        let id = ProxyIdentity(settings: s, gatewayID: "hall", room: "Hall")
        #expect(id.name == "hall-pi" && id.friendlyName == "The hall" && id.compactMAC == "02ba70123456")
        #expect(String(decoding: id.info.macAddress, as: UTF8.self) == "02:BA:70:12:34:56")
        #expect(s.mdnsServiceFile.isEmpty)
    }

    /// docs/esphome.md "Active scanning": auto follows Home Assistant's requests; passive and
    /// active pin the radio.
    @Test func theScanModeIsAutoUnlessPinned() throws {
        #expect(try #require(try load("esphome:\n  encryption: none\n").esphome).scanMode == .onRequest)
        #expect(try #require(try load("esphome:\n  encryption: none\n  scan-mode: passive\n").esphome).scanMode == .passive)
        #expect(try #require(try load("esphome:\n  encryption: none\n  scan-mode: Active\n").esphome).scanMode == .active)
        #expect(problem("esphome:\n  encryption: none\n  scan-mode: on\n")
                == "/etc/baton/baton.yaml:3: esphome.scan-mode: expected auto, passive or active, got \"on\"")
    }
}
