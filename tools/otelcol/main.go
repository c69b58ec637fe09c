// A small OpenTelemetry Collector for mprof's tests (tests/common/otelcol.rs): the core OTLP
// receiver (HTTP and gRPC) and one exporter of its own, `framedfile`, which appends every
// profiles batch that reaches it to a file, so that a test can read back exactly what a real
// collector accepted. The profiles signal is still in development: its feature gate
// (service.profilesSupport) is turned on here, before the collector reads its config.
//
// Built by tools/test-deps.sh into a cache keyed by the hash of this folder's go.mod, go.sum
// and *.go; run as `otelcol --config FILE.yaml`. A config the tests write:
//
//	receivers:
//	  otlp:
//	    protocols:
//	      http: {endpoint: "127.0.0.1:PORT"}
//	      grpc: {endpoint: "127.0.0.1:PORT"}
//	exporters:
//	  framedfile: {path: /tmp/…/received.bin}
//	service:
//	  telemetry: {metrics: {level: none}}
//	  pipelines:
//	    profiles: {receivers: [otlp], exporters: [framedfile]}
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/envprovider"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/xexporter"
	"go.opentelemetry.io/collector/featuregate"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func main() {
	go exitWithParent()
	if err := featuregate.GlobalRegistry().Set("service.profilesSupport", true); err != nil {
		log.Fatalf("otelcol: profiles feature gate: %v", err)
	}
	settings := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{
			Command:     "otelcol",
			Description: "OpenTelemetry Collector for mprof's tests",
			Version:     "0.165.0",
		},
		Factories: factories,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{
			ResolverSettings: confmap.ResolverSettings{
				// env: the scheme of a bare ${NAME} (the command's default); file: --config.
				ProviderFactories: []confmap.ProviderFactory{
					envprovider.NewFactory(),
					fileprovider.NewFactory(),
				},
			},
		},
	}
	if err := otelcol.NewCommand(settings).Execute(); err != nil {
		log.Fatalf("otelcol: %v", err)
	}
}

// exitWithParent ends the collector when the process that started it is gone (a test binary
// killed before its guard could stop it): a test collector never outlives its test.
func exitWithParent() {
	parent := os.Getppid()
	for {
		time.Sleep(200 * time.Millisecond)
		if os.Getppid() != parent {
			log.Printf("otelcol: parent %d is gone: exiting", parent)
			os.Exit(1)
		}
	}
}

func factories() (otelcol.Factories, error) {
	receivers, err := otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	exporters, err := otelcol.MakeFactoryMap[exporter.Factory](newFramedFileFactory())
	if err != nil {
		return otelcol.Factories{}, err
	}
	return otelcol.Factories{
		Receivers: receivers,
		Exporters: exporters,
		Telemetry: otelconftelemetry.NewFactory(),
	}, nil
}

// framedFileConfig is the `framedfile` exporter's config: the file it appends to.
type framedFileConfig struct {
	Path string `mapstructure:"path"`
}

func (c *framedFileConfig) Validate() error {
	if c.Path == "" {
		return errors.New("framedfile: path is required")
	}
	return nil
}

func newFramedFileFactory() xexporter.Factory {
	return xexporter.NewFactory(
		component.MustNewType("framedfile"),
		func() component.Config { return &framedFileConfig{} },
		xexporter.WithProfiles(createFramedFile, component.StabilityLevelDevelopment),
	)
}

func createFramedFile(_ context.Context, _ exporter.Settings, cfg component.Config) (xexporter.Profiles, error) {
	return &framedFile{path: cfg.(*framedFileConfig).Path}, nil
}

// framedFile appends each batch to its file as one frame: a 4-byte little-endian length, then
// that many bytes of a serialized opentelemetry.proto.collector.profiles.v1development
// ExportProfilesServiceRequest (pprofile.ProtoMarshaler's output; the same bytes also decode
// as a ProfilesData, whose fields 1 and 2 are the same). A frame is written with one write(2)
// before ConsumeProfiles returns, so the sender's successful export means it is in the file.
// The marshaler moves resource and scope attribute strings into the dictionary's string table
// (KeyValue.key_strindex, AnyValue.string_value_strindex): readers resolve them.
type framedFile struct {
	path string
	mu   sync.Mutex
	file *os.File
}

func (f *framedFile) Start(context.Context, component.Host) error {
	file, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("framedfile: %w", err)
	}
	f.file = file
	return nil
}

func (f *framedFile) Shutdown(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.file == nil {
		return nil
	}
	err := f.file.Close()
	f.file = nil
	return err
}

// Capabilities says the exporter mutates its input: the marshaler rewrites attribute strings
// into string-table references in place, so the pipeline hands it data of its own.
func (f *framedFile) Capabilities() consumer.Capabilities {
	return consumer.Capabilities{MutatesData: true}
}

func (f *framedFile) ConsumeProfiles(_ context.Context, pd pprofile.Profiles) error {
	marshaler := pprofile.ProtoMarshaler{}
	body, err := marshaler.MarshalProfiles(pd)
	if err != nil {
		return fmt.Errorf("framedfile: marshal: %w", err)
	}
	frame := make([]byte, 4, 4+len(body))
	binary.LittleEndian.PutUint32(frame, uint32(len(body)))
	frame = append(frame, body...)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.file == nil {
		return errors.New("framedfile: not started")
	}
	_, err = f.file.Write(frame)
	return err
}
