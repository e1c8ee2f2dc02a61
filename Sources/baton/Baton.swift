import ArgumentParser
import BatonGateway

@main
struct Baton: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "baton",
        abstract: "Carries a person's current activity across the rooms of a building.",
        version: BatonVersion.current,
        subcommands: [GatewayCommand.self, WatchCommand.self, FetchCommand.self, StreamCommand.self, Replay.self, Sim.self, DeviceCommand.self, ContinueCommand.self])
}
